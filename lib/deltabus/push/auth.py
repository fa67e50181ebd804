"""OIDC tokens for push: an RS256 key kept private, a JWKS document, tokens reused until near expiry.

The private key file is created with mode 0600 on first use and never logged; the public
key is published as ``jwks.json`` next to it so endpoints can verify tokens with any
standard OIDC/JWT library.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeAlias

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from ..errors import FailedPrecondition

log = logging.getLogger(__name__)

TOKEN_LIFETIME = 3600
REFRESH_BEFORE = 300  # a token with less than this left is replaced
KEY_FILE = "signing-key.pem"
JWKS_FILE = "jwks.json"

Jwks: TypeAlias = dict[str, list[dict[str, Any]]]
"""A JSON Web Key Set document: ``{"keys": [jwk, ...]}`` (RFC 7517, section 5)."""


def _subject(email: str) -> str:
    """A stable numeric subject for a service account, like Google's unique ids."""
    return str(int.from_bytes(hashlib.sha256(email.encode()).digest()[:9], "big")).zfill(21)


class SigningKey:
    """The RS256 key under ``keys_dir``: loaded, or created (0600) on first use."""

    def __init__(self, keys_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(keys_dir)
        self._key = self._load_or_create()
        public = self._key.public_key()
        der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        self.kid = hashlib.sha256(der).hexdigest()[:40]
        jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(public))
        jwk.update({"kid": self.kid, "alg": "RS256", "use": "sig"})
        self.jwks: Jwks = {"keys": [jwk]}
        self._write_jwks()

    def _load_or_create(self) -> rsa.RSAPrivateKey:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / KEY_FILE
        if not path.exists():
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            tmp = self.dir / f".{KEY_FILE}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            try:
                os.link(tmp, path)  # atomic: a concurrent creator's key wins, ours is dropped
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
            log.info("created push signing key in %s", self.dir)
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise FailedPrecondition(f"push signing key {path} must be private (mode 0600), has mode {mode:o}")
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(loaded, rsa.RSAPrivateKey):
            raise FailedPrecondition(f"push signing key {path} is not an RSA key")
        return loaded

    def _write_jwks(self) -> None:
        path = self.dir / JWKS_FILE
        text = json.dumps(self.jwks, indent=2)
        if path.exists() and path.read_text() == text:
            return
        tmp = self.dir / f".{JWKS_FILE}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)

    def sign(self, claims: dict[str, object]) -> str:
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": self.kid, "typ": "JWT"})

    def __repr__(self) -> str:  # never show key material
        return f"SigningKey(dir={str(self.dir)!r}, kid={self.kid!r})"


@dataclass(frozen=True, slots=True)
class _Cached:
    token: str
    expires: float


class TokenSource:
    """One token per (service account, audience), reused until REFRESH_BEFORE of its expiry."""

    def __init__(self, key: SigningKey, *, issuer: str, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self._issuer = issuer
        self._clock = clock
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._lock = threading.Lock()
        self.signed = 0  # how many tokens were signed (tests and metrics)

    @property
    def jwks(self) -> Jwks:
        return self._key.jwks

    def token(self, email: str, audience: str) -> str:
        now = self._clock()
        with self._lock:
            hit = self._cache.get((email, audience))
            if hit is not None and hit.expires - now > REFRESH_BEFORE:
                return hit.token
            iat = int(now)
            subject = _subject(email)
            claims: dict[str, object] = {
                "aud": audience,
                "azp": subject,
                "email": email,
                "email_verified": True,
                "exp": iat + TOKEN_LIFETIME,
                "iat": iat,
                "iss": self._issuer,
                "sub": subject,
            }
            token = self._key.sign(claims)
            self.signed += 1
            self._cache[(email, audience)] = _Cached(token, iat + TOKEN_LIFETIME)
            return token
