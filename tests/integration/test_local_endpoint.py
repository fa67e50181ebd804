"""The demo push endpoint on 127.0.0.1: explicit start()/stop() for notebooks, as well as `with`."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from deltabus.push.local_endpoint import LocalEndpoint


def _post(url: str, message_id: str) -> int:
    body = json.dumps({"message": {"messageId": message_id, "data": base64.b64encode(b"hi").decode(), "attributes": {"k": "v"}},
                       "subscription": "projects/p/subscriptions/s", "deliveryAttempt": 2}).encode()
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_start_and_stop_without_a_with_block():
    ep = LocalEndpoint(status=500, clock=lambda: 1234.5)
    with pytest.raises(RuntimeError, match="not started"):
        ep.url
    assert ep.start() is ep
    url = ep.url
    assert url.startswith("http://127.0.0.1:")
    assert _post(url, "m1") == 500
    [push] = ep.pushes
    assert (push.message_id, push.data, push.attributes, push.delivery_attempt, push.received_at) == ("m1", b"hi", {"k": "v"}, 2, 1234.5)
    ep.stop()
    ep.stop()  # idempotent: a notebook's last cell may run twice
    with pytest.raises(urllib.error.URLError):
        _post(url, "m2")  # the port is closed
    with pytest.raises(RuntimeError, match="stopped"):
        ep.url
    with pytest.raises(RuntimeError, match="already stopped"):
        ep.start()
    assert [p.message_id for p in ep.pushes] == ["m1"]  # what was received stays readable


def test_with_block_starts_and_stops():
    with LocalEndpoint() as ep:
        assert _post(ep.url, "m1") == 204
        with pytest.raises(RuntimeError, match="already started"):
            ep.start()
    with pytest.raises(RuntimeError, match="stopped"):
        ep.url
    assert ep.pushes[0].received_at > 0
