"""The push requests of a subscription's leases, built from a real warehouse in a temp dir."""

import logging
import os
import stat
import time

import jwt

from deltabus.push.request_builder import RequestBuilder
from deltabus.push.sender import REQUEST_SCHEMA
from deltabus.registry import Registry
from deltabus.storage import open_engine
from deltabus.timestamps import to_us

EMAIL = "pusher@local.iam.gserviceaccount.com"


def test_requests_carry_payload_wrapping_deadline_and_a_token(pub, psub, topic, warehouse, tmp_path, caplog):
    s = psub.subscription_path("local", "oidc")
    endpoint = "https://hooks.example.com/push?key=s3cret"
    psub.create_subscription(name=s, topic=topic, ack_deadline_seconds=30,
                             push_config={"push_endpoint": endpoint, "oidc_token": {"service_account_email": EMAIL}})
    one, two = pub.publish_batch(topic, [{"data": b"one", "attributes": {"a": "1"}, "ordering_key": "k"}, {"data": b"two"}])
    engine = open_engine(warehouse, create=False)
    rec = Registry(engine, clock=time.time).subscription(s)
    keys = tmp_path / "keys"
    builder = RequestBuilder(engine, keys_path=str(keys), issuer="https://issuer.test", clock=time.time)
    leased_at = 1_700_000_000.25
    with caplog.at_level(logging.INFO, logger="deltabus"):
        table = builder.build(rec, [(two, 3), (one, 1), ("no-such-id", 1)], leased_at)
    assert table.schema == REQUEST_SCHEMA
    rows = {r["message_id"]: r for r in table.to_pylist()}
    assert set(rows) == {one, two}  # the id without a payload is left out, and said so
    assert "1 leased messages of projects/local/subscriptions/oidc have no payload" in caplog.text
    assert rows[one]["data"] == b"one" and dict(rows[one]["attributes"]) == {"a": "1"} and rows[one]["ordering_key"] == "k"
    assert rows[two]["delivery_attempt"] == 3 and rows[one]["delivery_attempt"] == 1
    assert rows[one]["timeout_seconds"] == 30.0 and rows[one]["endpoint"] == endpoint and not rows[one]["no_wrapper"]
    assert table["lease_expires"].cast("int64").to_pylist() == [to_us(leased_at + 30)] * 2
    claims = jwt.decode(rows[one]["token"], options={"verify_signature": False})
    assert claims["email"] == EMAIL and claims["aud"] == endpoint and claims["iss"] == "https://issuer.test"
    assert stat.S_IMODE(os.stat(keys / "signing-key.pem").st_mode) == 0o600
    assert rows[one]["token"] not in caplog.text and "s3cret" not in caplog.text


def test_no_signing_key_is_made_without_oidc_subscriptions(pub, psub, topic, warehouse, tmp_path):
    s = psub.subscription_path("local", "plain")
    psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    [mid] = pub.publish_batch(topic, [{"data": b"x"}])
    engine = open_engine(warehouse, create=False)
    builder = RequestBuilder(engine, keys_path=str(tmp_path / "keys"), issuer="https://issuer.test", clock=time.time)
    table = builder.build(Registry(engine, clock=time.time).subscription(s), [(mid, 1)], time.time())
    assert table["token"].to_pylist() == [None]
    assert not (tmp_path / "keys").exists()
    assert builder.build(Registry(engine, clock=time.time).subscription(s), [], time.time()).num_rows == 0
