"""Push request bodies and headers, exactly as Pub/Sub sends them."""

from __future__ import annotations

import binascii
import datetime as dt
import functools
import json
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

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


def rfc3339_column(ts: "pa.Array | pa.ChunkedArray") -> pa.Array:
    """``rfc3339`` of every timestamp of a UTC timestamp[us] column, computed in Arrow
    (converting each to a datetime first cost more than the rest of building a push)."""
    ts = pa.chunked_array([ts]) if isinstance(ts, pa.Array) else ts
    ts = ts.combine_chunks() if ts.num_chunks else pa.array([], ts.type)
    whole = pc.cast(ts, pa.timestamp("s", tz="UTC"), safe=False)  # %S of a us timestamp prints a fraction
    seconds = pc.strftime(whole, format="%Y-%m-%dT%H:%M:%S")
    micros = pc.cast(ts, pa.int64())
    us = pc.subtract(micros, pc.multiply(pc.divide(micros, 1_000_000), 1_000_000))
    ms_only = pc.equal(pc.subtract(us, pc.multiply(pc.divide(us, 1000), 1000)), 0)
    three = pc.binary_join_element_wise(".", pc.utf8_lpad(pc.cast(pc.divide(us, 1000), pa.string()), 3, "0"), "")
    six = pc.binary_join_element_wise(".", pc.utf8_lpad(pc.cast(us, pa.string()), 6, "0"), "")
    fraction = pc.if_else(pc.equal(us, 0), "", pc.if_else(ms_only, three, six))
    return pc.binary_join_element_wise(seconds, fraction, "Z", "")


def wrapped(
    *,
    subscription: str,
    message_id: str,
    data: bytes,
    attributes: Mapping[str, str],
    publish_time: dt.datetime | str,
    ordering_key: str,
    delivery_attempt: int,
) -> bytes:
    """The JSON body of a wrapped push. Attributes appear when present, orderingKey when set.
    `publish_time` may come already formatted (``rfc3339``).

    Written out piece by piece (the same bytes as ``json.dumps`` of the nested dicts, which a
    test checks): this runs once per push, and building the dicts cost twice as much.
    """
    mid = _string(message_id)
    when = '"' + (publish_time if isinstance(publish_time, str) else _rfc3339_cached(publish_time)) + '"'
    parts = ['{"message":{"data":"', binascii.b2a_base64(data, newline=False).decode("ascii"), '"']
    if attributes:
        parts += [',"attributes":', json.dumps(dict(attributes), separators=(",", ":"), ensure_ascii=False)]
    parts += [',"messageId":', mid, ',"message_id":', mid, ',"publishTime":', when, ',"publish_time":', when]
    if ordering_key:
        parts += [',"orderingKey":', _string(ordering_key)]
    parts += ['},"subscription":', _string(subscription), ',"deliveryAttempt":', str(int(delivery_attempt)), "}"]
    return "".join(parts).encode("utf-8")


# json's own string encoder (C), as json.dumps(..., ensure_ascii=False) uses it.
_string = json.encoder.encode_basestring


@functools.lru_cache(maxsize=4096)
def _rfc3339_cached(ts: dt.datetime) -> str:
    """``rfc3339`` memoised. Kept as a module-level cache because it is safe: a pure function
    of an immutable argument (a datetime), bounded (4,096 entries, a few hundred KiB), and
    holding no shared or mutable state; a batch's messages share few publish times."""
    return rfc3339(ts)


def unwrapped_headers(
    *,
    subscription: str,
    message_id: str,
    attributes: Mapping[str, str],
    publish_time: dt.datetime | str,
    ordering_key: str,
    write_metadata: bool,
) -> dict[str, str]:
    """Headers of an unwrapped push (the body is the raw data)."""
    if not write_metadata:
        return {}
    headers = {
        "x-goog-pubsub-message-id": message_id,
        "x-goog-pubsub-publish-time": publish_time if isinstance(publish_time, str) else rfc3339(publish_time),
        "x-goog-pubsub-subscription-name": subscription,
    }
    if ordering_key:
        headers["x-goog-pubsub-ordering-key"] = ordering_key
    headers.update(attributes)
    return headers
