"""What no log line may hold: the push signing key, issued tokens, payloads, secret values.

``Secrets`` collects them (with a name each, so a failure says what leaked without printing
it again) and ``found(text)`` lists the names of those in `text`, plus any JWT-looking
string (``eyJ`` and 17+ more base64url characters: a JSON object, base64url-encoded).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

JWT_LIKE = re.compile(r"eyJ[A-Za-z0-9_-]{17,}")


class Secrets:
    def __init__(self) -> None:
        self._items: list[tuple[str, str]] = []  # (name, text)

    def add(self, name: str, value: str | bytes) -> None:
        text = value.decode() if isinstance(value, bytes) else value
        assert len(text) >= 8, f"{name}: too short to look for"
        self._items.append((name, text))

    def add_payload(self, name: str, data: bytes) -> None:
        """The bytes as text, and their base64 (a wrapped push body carries that) in both alphabets."""
        self.add(name, data)
        b64 = base64.b64encode(data).decode()
        self.add(f"{name} (base64)", b64.rstrip("="))
        self.add(f"{name} (base64url)", base64.urlsafe_b64encode(data).decode().rstrip("="))

    def add_key_file(self, path: str | Path) -> None:
        """Every line of a PEM private key but its BEGIN/END markers."""
        lines = [line for line in Path(path).read_text().splitlines() if line and not line.startswith("-----")]
        assert lines, f"no key in {path}"
        for i, line in enumerate(lines):
            self.add(f"signing key line {i + 1}", line)

    def add_token(self, name: str, token: str) -> None:
        """The token and each of its parts (header, claims, signature)."""
        self.add(name, token)
        for part, segment in zip(("header", "claims", "signature"), token.split(".")):
            self.add(f"{name} {part}", segment)

    def __len__(self) -> int:
        return len(self._items)

    def found(self, text: str) -> list[str]:
        hits = [name for name, secret in self._items if secret in text]
        hits += [f"a JWT-like string {m.group()[:12]}..." for m in JWT_LIKE.finditer(text)]
        return hits
