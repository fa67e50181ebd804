"""Push request bodies and headers, exactly as Pub/Sub sends them."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Mapping

ACK_STATUSES = frozenset({102, 200, 201, 202, 204})


def rfc3339(ts: dt.datetime) -> str:
    """UTC with a Z, and 0, 3 or 6 fractional digits as needed (as protobuf JSON does)."""
    ts = ts.astimezone(dt.timezone.utc)
    base = ts.strftime("%Y-%m-%dT%H:%M:%S")
    us = ts.microsecond
    if us == 0:
        return base + "Z"
    if us % 1000 == 0:
        return f"{base}.{us // 1000:03d}Z"
    return f"{base}.{us:06d}Z"


def wrapped(
    *,
    subscription: str,
    message_id: str,
    data: bytes,
    attributes: Mapping[str, str],
    publish_time: dt.datetime,
    ordering_key: str,
    delivery_attempt: int,
) -> bytes:
    """The JSON body of a wrapped push. Attributes appear when present, orderingKey when set."""
    message: dict[str, object] = {"data": base64.b64encode(data).decode("ascii")}
    if attributes:
        message["attributes"] = dict(attributes)
    when = rfc3339(publish_time)
    message.update({"messageId": message_id, "message_id": message_id, "publishTime": when, "publish_time": when})
    if ordering_key:
        message["orderingKey"] = ordering_key
    body = {"message": message, "subscription": subscription, "deliveryAttempt": delivery_attempt}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def unwrapped_headers(
    *,
    subscription: str,
    message_id: str,
    attributes: Mapping[str, str],
    publish_time: dt.datetime,
    ordering_key: str,
    write_metadata: bool,
) -> dict[str, str]:
    """Headers of an unwrapped push (the body is the raw data)."""
    if not write_metadata:
        return {}
    headers = {
        "x-goog-pubsub-message-id": message_id,
        "x-goog-pubsub-publish-time": rfc3339(publish_time),
        "x-goog-pubsub-subscription-name": subscription,
    }
    if ordering_key:
        headers["x-goog-pubsub-ordering-key"] = ordering_key
    headers.update(attributes)
    return headers
