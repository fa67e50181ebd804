import json
import os
import stat

import jwt
import pytest

from deltabus import FailedPrecondition
from deltabus.push.auth import REFRESH_BEFORE, SigningKey, TokenSource
from tests.conftest import ManualClock


def test_key_is_private_and_jwks_public(tmp_path):
    key = SigningKey(tmp_path / "keys")
    mode = stat.S_IMODE(os.stat(tmp_path / "keys" / "signing-key.pem").st_mode)
    assert mode == 0o600
    jwks = json.loads((tmp_path / "keys" / "jwks.json").read_text())
    assert jwks["keys"][0]["kid"] == key.kid and jwks["keys"][0]["alg"] == "RS256"
    assert "d" not in jwks["keys"][0]  # no private part
    assert "PRIVATE" not in repr(key)
    assert SigningKey(tmp_path / "keys").kid == key.kid  # loaded again, not regenerated


def test_key_readable_by_others_is_refused(tmp_path):
    SigningKey(tmp_path)
    os.chmod(tmp_path / "signing-key.pem", 0o644)
    with pytest.raises(FailedPrecondition, match="0600"):
        SigningKey(tmp_path)


def test_token_claims_and_verification(tmp_path):
    key = SigningKey(tmp_path)
    clock = ManualClock(1_700_000_000.0)
    tokens = TokenSource(key, issuer="https://issuer.test", clock=clock)
    tok = tokens.token("sa@p.iam.gserviceaccount.com", "https://endpoint.test/push")
    header = jwt.get_unverified_header(tok)
    assert header == {"alg": "RS256", "kid": key.kid, "typ": "JWT"}
    public = jwt.PyJWK(key.jwks["keys"][0]).key
    claims = jwt.decode(tok, public, algorithms=["RS256"], audience="https://endpoint.test/push",
                        issuer="https://issuer.test", options={"verify_exp": False})
    assert claims["email"] == "sa@p.iam.gserviceaccount.com" and claims["email_verified"] is True
    assert claims["sub"] == claims["azp"] and claims["exp"] - claims["iat"] == 3600


def test_tokens_are_reused_until_near_expiry(tmp_path):
    clock = ManualClock(1_700_000_000.0)
    tokens = TokenSource(SigningKey(tmp_path), issuer="i", clock=clock)
    a = tokens.token("sa@x.com", "aud")
    assert tokens.token("sa@x.com", "aud") == a and tokens.signed == 1
    assert tokens.token("sa@x.com", "other") != a and tokens.signed == 2
    clock.advance(3600 - REFRESH_BEFORE - 1)
    assert tokens.token("sa@x.com", "aud") == a
    clock.advance(2)
    assert tokens.token("sa@x.com", "aud") != a and tokens.signed == 3
