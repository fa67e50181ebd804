import base64
import datetime as dt
import json

from deltabus.push.body import ACK_STATUSES, rfc3339, unwrapped_headers, wrapped

T = dt.datetime(2021, 2, 26, 19, 13, 55, 749000, tzinfo=dt.timezone.utc)


def test_rfc3339_uses_z_and_minimal_fraction():
    assert rfc3339(T) == "2021-02-26T19:13:55.749Z"
    assert rfc3339(T.replace(microsecond=0)) == "2021-02-26T19:13:55Z"
    assert rfc3339(T.replace(microsecond=123456)) == "2021-02-26T19:13:55.123456Z"
    other_zone = T.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert rfc3339(other_zone) == "2021-02-26T19:13:55.749Z"


def test_wrapped_body_minimum_is_byte_exact():
    body = wrapped(subscription="projects/p/subscriptions/s", message_id="2070443601311540", data=b"Hello there",
                   attributes={}, publish_time=T, ordering_key="", delivery_attempt=1)
    assert body == (
        b'{"message":{"data":"SGVsbG8gdGhlcmU=","messageId":"2070443601311540","message_id":"2070443601311540",'
        b'"publishTime":"2021-02-26T19:13:55.749Z","publish_time":"2021-02-26T19:13:55.749Z"},'
        b'"subscription":"projects/p/subscriptions/s","deliveryAttempt":1}'
    )


def test_wrapped_body_maximum():
    body = wrapped(subscription="projects/p/subscriptions/s", message_id="1", data=b"\x00\xff", attributes={"key": "value", "é": "ü"},
                   publish_time=T, ordering_key="key", delivery_attempt=5)
    doc = json.loads(body)
    assert list(doc) == ["message", "subscription", "deliveryAttempt"]
    assert list(doc["message"]) == ["data", "attributes", "messageId", "message_id", "publishTime", "publish_time", "orderingKey"]
    assert base64.b64decode(doc["message"]["data"]) == b"\x00\xff"
    assert doc["message"]["attributes"] == {"key": "value", "é": "ü"} and doc["deliveryAttempt"] == 5


def test_unwrapped_headers():
    kw = dict(subscription="projects/p/subscriptions/s", message_id="7", attributes={"a": "1"}, publish_time=T)
    assert unwrapped_headers(ordering_key="", write_metadata=False, **kw) == {}
    assert unwrapped_headers(ordering_key="ok", write_metadata=True, **kw) == {
        "x-goog-pubsub-message-id": "7",
        "x-goog-pubsub-publish-time": "2021-02-26T19:13:55.749Z",
        "x-goog-pubsub-subscription-name": "projects/p/subscriptions/s",
        "x-goog-pubsub-ordering-key": "ok",
        "a": "1",
    }


def test_ack_statuses_are_pubsubs():
    assert ACK_STATUSES == {102, 200, 201, 202, 204}


def test_wrapped_matches_json_dumps_of_the_nested_dicts():
    """The hand-built body is exactly json.dumps of Pub/Sub's nested message, escapes included."""
    cases = [
        dict(data=b"", attributes={}, ordering_key="", delivery_attempt=1),
        dict(data=bytes(range(256)), attributes={"q": 'say "hi"\\', "ctl": "a\nb\x01", "emoji": "🙂"}, ordering_key='k"\n', delivery_attempt=12),
        dict(data=b"x" * 1024, attributes={"é": "ü"}, ordering_key="ordering key", delivery_attempt=100),
    ]
    for kw in cases:
        message = {"data": base64.b64encode(kw["data"]).decode()}
        if kw["attributes"]:
            message["attributes"] = kw["attributes"]
        message.update(messageId="42", message_id="42", publishTime=rfc3339(T), publish_time=rfc3339(T))
        if kw["ordering_key"]:
            message["orderingKey"] = kw["ordering_key"]
        doc = {"message": message, "subscription": "projects/p/subscriptions/s\u2028", "deliveryAttempt": kw["delivery_attempt"]}
        expected = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
        assert wrapped(subscription="projects/p/subscriptions/s\u2028", message_id="42", publish_time=T, **kw) == expected


def test_rfc3339_column_matches_rfc3339():
    import random

    import pyarrow as pa

    from deltabus.push.body import rfc3339_column

    rng = random.Random(7)
    base = dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)
    times = [T, T.replace(microsecond=0), T.replace(microsecond=123456), T.replace(microsecond=1000), T.replace(microsecond=5),
             dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)]
    times += [base + dt.timedelta(microseconds=rng.randrange(10**13)) for _ in range(500)]
    got = rfc3339_column(pa.array(times, pa.timestamp("us", tz="UTC"))).to_pylist()
    assert got == [rfc3339(t) for t in times]
    assert rfc3339_column(pa.chunked_array([], pa.timestamp("us", tz="UTC"))).to_pylist() == []


def test_preformatted_publish_time_gives_the_same_body_and_headers():
    kw = dict(subscription="projects/p/subscriptions/s", message_id="9", attributes={"a": "b"}, ordering_key="k")
    assert wrapped(data=b"d", publish_time=rfc3339(T), delivery_attempt=2, **kw) == wrapped(data=b"d", publish_time=T, delivery_attempt=2, **kw)
    assert unwrapped_headers(publish_time=rfc3339(T), write_metadata=True, **kw) == unwrapped_headers(publish_time=T, write_metadata=True, **kw)
