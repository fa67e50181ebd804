"""One push request, as the push workers (``worker.py``) send it on the executors.

Each request's timeout is its subscription's ack deadline; no answer in time is a nack.
Nothing here logs a token or a payload.

An endpoint is not trusted with more than its own answer: a redirect is not followed (its
status is the nack; the payload and token go nowhere else), at most ``MAX_BODY`` bytes of a
body are read (a longer one is dropped with its connection, not held in memory), and the
session keeps no cookies (``push_session``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import logging
import time
from typing import Any, Mapping, NamedTuple, Sequence

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc

from ..storage.tables import STR_MAP, TS
from .body import ACK_STATUSES, rfc3339_column, unwrapped_headers, wrapped
from .outcome import ACK, ERROR, NACK, TIMEOUT, PushOutcome

log = logging.getLogger(__name__)

REQUEST_SCHEMA = pa.schema(
    [
        pa.field("sub_uid", pa.string()),
        pa.field("subscription", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("delivery_attempt", pa.int32()),
        pa.field("endpoint", pa.string()),
        pa.field("token", pa.string()),
        pa.field("no_wrapper", pa.bool_()),
        pa.field("write_metadata", pa.bool_()),
        pa.field("timeout_seconds", pa.float64()),
        pa.field("data", pa.binary()),
        pa.field("attributes", STR_MAP),
        pa.field("ordering_key", pa.string()),
        pa.field("publish_time", TS),
        # When the lease ends: a push that has not gone out by then is not sent at all
        # (its message is due again, under a new attempt).
        pa.field("lease_expires", TS),
    ]
)

OUTCOME_SCHEMA = pa.schema(
    [
        pa.field("sub_uid", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("delivery_attempt", pa.int32()),
        pa.field("status", pa.int32()),  # HTTP status; 0 when there was no answer
        pa.field("outcome", pa.string()),  # a PushOutcome (outcome.py): ack | nack | timeout | error | expired
        pa.field("latency_seconds", pa.float64()),
        # Why a push failed without an HTTP answer (error_class): "connection refused", "tls", ...;
        # empty otherwise. A closed set of words, never the exception's text (it may hold a URL).
        pa.field("error", pa.string()),
    ]
)

# Concurrent requests per subscription in one push worker. Loopback aiohttp peaks at 32..100 in flight; the
# push window decides how many are outstanding overall, this only paces the sockets.
MAX_CONCURRENCY = 64

# The most of an answer's body a push reads (Pub/Sub ignores it): an ordinary answer is read to its
# end, so its connection is reused; a longer body is left unread and its connection closed.
MAX_BODY = 64 * 1024


class Request(NamedTuple):
    """One push, in REQUEST_SCHEMA's column order."""

    sub_uid: str
    subscription: str
    message_id: str
    delivery_attempt: int
    endpoint: str
    token: str | None
    no_wrapper: bool
    write_metadata: bool
    timeout_seconds: float
    data: bytes | None
    attributes: list[tuple[str, str]] | None
    ordering_key: str | None
    publish_time: dt.datetime | str  # or already in RFC 3339
    lease_expires: float | None = None  # seconds since the epoch


def requests_of(table: pa.Table) -> list[Request]:
    """The rows of a REQUEST_SCHEMA table (extra columns are ignored); publish times come
    formatted, done for the whole column at once."""
    columns = []
    for name in Request._fields:
        col = table.column(name)
        if name == "publish_time":
            col = rfc3339_column(col)
        elif name == "lease_expires":  # as epoch seconds: datetimes cost 3 us each
            col = pc.divide(pc.cast(pc.cast(col, pa.int64()), pa.float64()), 1e6)
        columns.append(col.to_pylist())
    return [Request._make(values) for values in zip(*columns)]


def _request(req: Request) -> tuple[bytes, dict[str, str]]:
    attrs = dict(req.attributes) if req.attributes else {}
    headers: dict[str, str] = {}
    if req.token:
        headers["Authorization"] = f"Bearer {req.token}"
    if req.no_wrapper:
        headers.update(
            unwrapped_headers(
                subscription=req.subscription,
                message_id=req.message_id,
                attributes=attrs,
                publish_time=req.publish_time,
                ordering_key=req.ordering_key or "",
                write_metadata=bool(req.write_metadata),
            )
        )
        return req.data or b"", headers
    headers["Content-Type"] = "application/json"
    body = wrapped(
        subscription=req.subscription,
        message_id=req.message_id,
        data=req.data or b"",
        attributes=attrs,
        publish_time=req.publish_time,
        ordering_key=req.ordering_key or "",
        delivery_attempt=req.delivery_attempt,
    )
    return body, headers


def error_class(exc: BaseException) -> str:
    """A short, secret-free name for why a push got no HTTP answer (for logs and the backlog)."""
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError)):
        return "tls"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns"
    if isinstance(exc, (aiohttp.InvalidUrlClientError, aiohttp.NonHttpUrlClientError, ValueError)):
        return "invalid url"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "disconnected"
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):  # not HTTP, or too big a head
        return "bad response"
    code = getattr(exc, "errno", None)
    if code is None and isinstance(getattr(exc, "os_error", None), OSError):
        code = exc.os_error.errno  # type: ignore[attr-defined]
    if code == errno.ECONNREFUSED:
        return "connection refused"
    if code in (errno.ECONNRESET, errno.EPIPE) or isinstance(exc, aiohttp.ClientConnectionResetError):
        return "connection reset"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect failed"
    return "error"


async def send(session: aiohttp.ClientSession, req: Request) -> tuple[int, PushOutcome, float, str]:
    """POST one request; (HTTP status or 0, outcome, seconds, error class or "")."""
    body, headers = _request(req)
    # Latency is the endpoint's: measured from when the request really goes out.
    started = time.monotonic()
    # A ClientTimeout per push, no module-level cache of them: building one was measured at
    # ~1.5 us, nothing beside an HTTP round trip.
    try:
        async with session.post(
            req.endpoint, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=req.timeout_seconds), allow_redirects=False
        ) as resp:
            status = resp.status
            left = MAX_BODY  # read within the timeout: a body dripping past the deadline is a timeout
            while left > 0 and (chunk := await resp.content.read(left)):
                left -= len(chunk)
        return status, (ACK if status in ACK_STATUSES else NACK), time.monotonic() - started, ""
    except asyncio.TimeoutError:
        return 0, TIMEOUT, time.monotonic() - started, ""
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        log.debug("push to %s for %s failed: %s", req.subscription, req.message_id, type(exc).__name__)
        return 0, ERROR, time.monotonic() - started, error_class(exc)


def push_session(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
    """The session pushes go out on: bodies as sent (no decompression) and no cookie jar, so an
    endpoint's Set-Cookie neither grows a worker's memory nor rides on other subscriptions' pushes."""
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())


async def send_all(rows: Sequence[Mapping[str, Any]], concurrency: int = MAX_CONCURRENCY) -> list[tuple[int, PushOutcome, float, str]]:
    """POST every row (a mapping of REQUEST_SCHEMA's fields) with at most `concurrency`
    requests open; results in row order. For one-off sends and tests; the push job's
    workers keep their own session and queues (``worker.py``)."""
    reqs = [Request(**{f: row[f] for f in Request._fields if f in row}) for row in rows]
    results: list[tuple[int, PushOutcome, float, str]] = [(0, ERROR, 0.0, "error")] * len(reqs)
    todo = iter(range(len(reqs)))
    connector = aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=300)
    async with push_session(connector) as session:

        async def worker() -> None:
            for i in todo:
                results[i] = await send(session, reqs[i])

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(reqs)))))
    return results
