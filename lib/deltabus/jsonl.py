"""The JSON-lines message format of ``deltabus publish --file``, parsed and validated.

One JSON object per line (blank lines are skipped), with these optional fields:

- ``data``: a string, sent as its UTF-8 text; or an object or array, sent as its compact
  JSON text (``{"order":1}``), so event JSON can be piped in as it is. Anything else
  (null, a number, a boolean) is refused: it is more likely a mistake than a payload.
- ``data_base64``: the data as standard, padded base64 (instead of ``data``).
- ``attributes``: an object of string values.
- ``ordering_key``: a string.

Nothing else is allowed: an unknown field is refused by name. Every error names the
source, the line number and the field (``events.jsonl:3: attributes: must be an object
of string values``), and every line is checked (with Pub/Sub's message limits) before
the caller publishes anything.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .errors import InvalidArgument
from .validation import check_message

FIELDS = ("data", "data_base64", "attributes", "ordering_key")


class LineError(InvalidArgument):
    """A bad line: ``field`` is ``SOURCE:LINE[: field]``, already in the user's terms, so a
    caller must not map it onto its own flags (a file named ``topic.jsonl`` is not --topic)."""


@dataclass(frozen=True, slots=True)
class Line:
    """One message read from a line: what to publish, and where it came from."""

    number: int
    data: bytes
    attributes: dict[str, str]
    ordering_key: str


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of two equal keys silently; a line with two "data" (or two
    attributes of one name) is a mistake to name, not a payload to guess at."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def parse_line(
    text: str,
    where: str,
    *,
    attributes: Mapping[str, str] | None = None,
    ordering_key: str = "",
) -> tuple[bytes, dict[str, str], str] | None:
    """(data, attributes, ordering_key) of one line, or None for a blank line.

    ``attributes`` and ``ordering_key`` are defaults (the command's --attribute and
    --ordering-key); the line's own values win. Raises InvalidArgument naming
    ``where: field``.
    """
    if not text.strip():
        return None
    try:
        obj = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(where, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:  # NaN, Infinity
        raise InvalidArgument(where, f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidArgument(where, f"must be a JSON object, got {_kind(obj)}")
    unknown = [k for k in obj if k not in FIELDS]
    if unknown:
        raise InvalidArgument(f"{where}: {unknown[0]}", f"unknown field; a line has {', '.join(FIELDS)}")

    if "data" in obj and "data_base64" in obj:
        raise InvalidArgument(f"{where}: data_base64", "give data or data_base64, not both")
    data = b""
    if "data" in obj:
        value = obj["data"]
        if isinstance(value, str):
            text_data = value
        elif isinstance(value, (dict, list)):
            text_data = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        else:
            raise InvalidArgument(
                f"{where}: data", f"must be a string, or an object or array (sent as compact JSON), got {_kind(value)}"
            )
        try:
            data = text_data.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{where}: data", "must be valid Unicode text (no lone surrogates)") from None
    elif "data_base64" in obj:
        value = obj["data_base64"]
        if not isinstance(value, str):
            raise InvalidArgument(f"{where}: data_base64", f"must be a base64 string, got {_kind(value)}")
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"{where}: data_base64", "must be standard base64 (A-Z a-z 0-9 + /, padded with =)") from None

    attrs = dict(attributes or {})
    if "attributes" in obj:
        value = obj["attributes"]
        if not isinstance(value, dict):
            raise InvalidArgument(f"{where}: attributes", f"must be an object of string values, got {_kind(value)}")
        for k, v in value.items():
            if not isinstance(v, str):
                raise InvalidArgument(f"{where}: attributes", f"must be an object of string values ({k!r} is {_kind(v)})")
        attrs.update(value)

    okey = ordering_key
    if "ordering_key" in obj:
        okey = obj["ordering_key"]
        if not isinstance(okey, str):
            raise InvalidArgument(f"{where}: ordering_key", f"must be a string, got {_kind(okey)}")

    try:
        check_message(data, attrs, okey, where="message")
    except InvalidArgument as exc:
        field = exc.field.removeprefix("message.") if exc.field != "message" else "message"
        raise InvalidArgument(f"{where}: {field}", exc.rule) from None
    return data, attrs, okey


def read_lines(
    lines: Iterable[bytes],
    source: str,
    *,
    attributes: Mapping[str, str] | None = None,
    ordering_key: str = "",
) -> list[Line]:
    """Parse every line of a JSON-lines source (raw bytes per line); the first error raises."""
    out: list[Line] = []
    for n, raw in enumerate(lines, 1):
        where = f"{source}:{n}"
        try:
            text = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a leading BOM is allowed
        except UnicodeDecodeError as exc:
            raise LineError(where, f"not UTF-8 text (byte {exc.start + 1})") from None
        try:
            parsed = parse_line(text, where, attributes=attributes, ordering_key=ordering_key)
        except LineError:
            raise
        except InvalidArgument as exc:
            raise LineError(exc.field, exc.rule) from None
        if parsed is not None:
            out.append(Line(n, *parsed))
    return out
