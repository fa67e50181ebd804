"""Hostile push endpoints against a real push worker (``worker.Worker``, fed by a ``PoolServer``).

Real servers on 127.0.0.1: aiohttp apps, and raw TCP servers for what no HTTP server would
send (garbage, a 1 MB header, a cut response, a reset). For each endpoint: nothing escapes
the worker, the outcome is the right kind (an ack only for 102/200/201/202/204), and the
same worker then pushes the same subscription's next message to a healthy endpoint.
Redirects are not followed (the payload and token go to the endpoint configured, nowhere
else), a huge body is not read into memory, cookies are not kept, and a body dripping past
the push timeout (the ack deadline) times out. No Spark here: the job's layers above the
worker only see the outcome rows this checks.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import struct
import threading
import time
import uuid
from typing import Awaitable, Callable

import pyarrow as pa
import pytest
from aiohttp import web

from deltabus._server_thread import ServerThread
from deltabus.push.ledger import PushLedger
from deltabus.push.pool import PoolServer
from deltabus.push.pool_tls import make_certificate
from deltabus.push.sender import REQUEST_SCHEMA
from deltabus.push.worker import Worker
from tests.endpoints import Endpoint

QUICK = 5.0  # the push timeout where an answer (or a failure) comes at once: generous
SHORT = 1.0  # the push timeout where the endpoint holds on: it must run out


# -- raw servers ---------------------------------------------------------------------------
Handler = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A TCP server on 127.0.0.1 in its own thread whose `handler` writes whatever bytes it likes.
    `requests` holds each request it read (head and body), `wrote` the body bytes it got out."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[bytes] = []
        self.wrote = 0
        self.finished = threading.Event()  # a handler returned
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-endpoint", daemon=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the worker hung up: what these servers are for
        finally:
            writer.close()
            self.finished.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/push"

    def __enter__(self) -> "RawServer":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def read_request(server: RawServer, reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    request = head + await reader.readexactly(length)
    server.requests.append(request)
    return request


def answer(raw: bytes) -> Handler:
    """Reads the request, writes `raw`, hangs up."""

    async def handle(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(server, reader)
        writer.write(raw)
        await writer.drain()

    return handle


async def reset(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(server, reader)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # an RST, not a FIN


async def hang(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(server, reader)
    await asyncio.sleep(3600)


async def silent(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accepts the connection and says nothing: to an https:// push, a handshake that never ends."""
    await reader.read(65536)
    await asyncio.sleep(3600)


async def not_tls(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Plain HTTP where TLS was expected: answers the ClientHello with an HTTP error."""
    await reader.read(65536)
    writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()


async def drip(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A 200 at once, then a 1,000-byte body one byte every 50 ms: 50 s, far past the push timeout."""
    await read_request(server, reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(0.05)


HUGE = 200 * 1024 * 1024


async def huge_body(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A 200 announcing 200 MiB, and streaming it as fast as the worker reads."""
    await read_request(server, reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE)
    chunk = b"x" * (1024 * 1024)
    while server.wrote < HUGE:
        writer.write(chunk)
        await writer.drain()
        server.wrote += len(chunk)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


# -- the worker ------------------------------------------------------------------------------
class Pool:
    """A pool server and one push worker (in a thread) that takes its work."""

    def __init__(self) -> None:
        self.server = PoolServer(PushLedger(), per_sub=8)
        self.worker = Worker(self.server.url, self.server.key, per_sub=8)
        self.pushed: int | None = None
        self._thread = threading.Thread(target=self._run, name="push-worker", daemon=True)
        self._thread.start()
        self.tokens: list[str] = []

    def _run(self) -> None:
        self.pushed = asyncio.run(self.worker.run())

    def push(self, url: str, timeout: float, sub: str = "hostile") -> dict:
        """Push one message through the worker; its outcome row."""
        mid, token = uuid.uuid4().hex, f"token-{uuid.uuid4().hex}"
        self.tokens.append(token)
        row = dict(sub_uid=sub, subscription=f"projects/p/subscriptions/{sub}", message_id=mid, delivery_attempt=1,
                   endpoint=url, token=token, no_wrapper=False, write_metadata=False, timeout_seconds=timeout,
                   data=f"payload-{mid}".encode(), attributes=[("k", "v")], ordering_key="",
                   publish_time=dt.datetime.now(dt.timezone.utc), lease_expires=None)
        self.server.ledger.submit(sub, pa.Table.from_pylist([row], schema=REQUEST_SCHEMA))
        self.server.notify()
        end = time.monotonic() + timeout + 30
        while time.monotonic() < end:
            rows = self.server.ledger.collect().outcomes.to_pylist()
            if rows:
                assert [r["message_id"] for r in rows] == [mid]
                return rows[0]
            time.sleep(0.02)
        raise AssertionError(f"no outcome for the push to {url}")

    def close(self) -> None:
        self.server.close()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the worker did not stop"
        self.server.stop()


@pytest.fixture
def pool(caplog):
    caplog.set_level(logging.DEBUG)
    p = Pool()
    yield p
    p.close()
    # Nothing escaped a send: the worker's catch-all ("sending failed unexpectedly") never ran.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.fixture(scope="module")
def healthy():
    with Endpoint() as ep:
        yield ep


def outcome(row: dict) -> tuple[int, str, str]:
    return row["status"], row["outcome"], row["error"]


def still_pushes(pool: Pool, healthy: Endpoint, sub: str = "hostile") -> None:
    """The same worker, the same subscription: the next push goes out and is acked."""
    before = len(healthy.snapshot())
    assert outcome(pool.push(healthy.url, QUICK, sub)) == (204, "ack", "")
    assert len(healthy.snapshot()) == before + 1


# -- the cases -----------------------------------------------------------------------------
BIG_HEADER = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\nContent-Length: 0\r\n\r\n"
MANY_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)) + b"Content-Length: 0\r\n\r\n"

BROKEN = {
    # what the endpoint does: (its handler, the outcome: status, kind, error class)
    "1 MB header": (answer(BIG_HEADER), (0, "error", "bad response")),
    "10,000 headers": (answer(MANY_HEADERS), (0, "error", "bad response")),
    "garbage, not HTTP": (answer(b"\x00\xff\xfegarbage that is not HTTP\r\n\r\n"), (0, "error", "bad response")),
    "a status out of range": (answer(b"HTTP/1.1 99999 Odd\r\nContent-Length: 0\r\n\r\n"), (0, "error", "bad response")),
    "a response cut mid-headers": (answer(b"HTTP/1.1 200 OK\r\nContent-Le"), (0, "error", "disconnected")),
    "a body shorter than announced": (answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc"), (0, "error", "bad response")),
    "hangs up without a word": (answer(b""), (0, "error", "disconnected")),
    "a connection reset": (reset, (0, "error", "connection reset")),
    "101 Switching Protocols": (answer(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"), (101, "nack", "")),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_answer_is_a_failed_push_and_the_worker_goes_on(pool, healthy, case):
    handler, expected = BROKEN[case]
    with RawServer(handler) as ep:
        assert outcome(pool.push(ep.url(), QUICK)) == expected
        assert len(ep.requests) == 1 and pool.tokens[-1].encode() in ep.requests[0]
    still_pushes(pool, healthy)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_not_followed_so_nothing_reaches_the_other_host(pool, healthy, status):
    with RawServer(answer(b"HTTP/1.1 204 No Content\r\n\r\n")) as elsewhere:  # records any method
        relative = answer(b"HTTP/1.1 %d Moved\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n" % status)
        away = answer(b"HTTP/1.1 %d Moved\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % (status, elsewhere.url().encode()))
        for handler in (away, relative):
            with RawServer(handler) as ep:
                # A nack, as any status but 102/200/201/202/204: not the answer of wherever it pointed.
                assert outcome(pool.push(ep.url(), QUICK)) == (status, "nack", "")
                assert len(ep.requests) == 1  # not even back to the same host
        assert elsewhere.requests == []  # neither the payload nor the token went there
    still_pushes(pool, healthy)


@pytest.mark.parametrize("handler", [hang, drip], ids=["no answer", "a body dripping past the deadline"])
def test_an_answer_that_takes_longer_than_the_ack_deadline_times_out(pool, healthy, handler):
    with RawServer(handler) as ep:
        row = pool.push(ep.url(), SHORT)
        assert outcome(row) == (0, "timeout", "") and row["latency_seconds"] >= SHORT * 0.9
    still_pushes(pool, healthy)


def test_a_2xx_with_a_200_mib_body_is_an_ack_without_reading_the_body(pool, healthy):
    """Pub/Sub ignores the body. The worker reads a little of it (to reuse the connection after
    an ordinary answer) and then hangs up: the server could not get 200 MiB out."""
    with RawServer(huge_body) as ep:
        assert outcome(pool.push(ep.url(), QUICK)) == (200, "ack", "")
        assert ep.finished.wait(10)  # its writes failed: the worker hung up
        assert ep.wrote < 64 * 1024 * 1024  # socket buffers at most, nowhere near 200 MiB
    still_pushes(pool, healthy)


def test_cookies_an_endpoint_sets_are_not_sent_back_by_any_subscription(pool, healthy):
    """No cookie jar: an endpoint's Set-Cookie neither grows the worker's memory nor reaches
    another subscription's pushes to the same host."""
    with RawServer(answer(b"HTTP/1.1 204 No Content\r\nSet-Cookie: sid=from-the-endpoint; Path=/\r\n\r\n")) as ep:
        url = ep.url(host="localhost")  # a cookie jar keeps no cookies of IP addresses
        for sub in ("hostile", "hostile", "another"):
            assert outcome(pool.push(url, QUICK, sub)) == (204, "ack", "")
        assert len(ep.requests) == 3 and not [r for r in ep.requests if b"\r\ncookie:" in r.lower()]
    still_pushes(pool, healthy)


def test_tls_failures_are_failed_pushes_and_nothing_is_sent_in_clear(pool, healthy):
    received: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/push", handle)
    untrusted = ServerThread(app, ssl_context=make_certificate("127.0.0.1", dt.datetime.now(dt.timezone.utc)).context).start()
    try:
        # A certificate the worker does not trust (self-signed).
        assert outcome(pool.push(f"https://127.0.0.1:{untrusted.port}/push", QUICK)) == (0, "error", "tls")
        assert received == []
    finally:
        untrusted.stop()
    # Plain HTTP where TLS was expected: the answer to the ClientHello is not TLS.
    with RawServer(not_tls) as plain:
        assert outcome(pool.push(plain.url("https"), QUICK)) == (0, "error", "tls")
    # A handshake that never ends: the push timeout (the ack deadline) covers it.
    with RawServer(silent) as mute:
        assert outcome(pool.push(mute.url("https"), SHORT)) == (0, "timeout", "")
    still_pushes(pool, healthy)


def test_a_refused_connection_is_a_failed_push(pool, healthy):
    assert outcome(pool.push(f"http://127.0.0.1:{closed_port()}/push", QUICK)) == (0, "error", "connection refused")
    still_pushes(pool, healthy)
