"""deltabus._server_thread: an aiohttp app on its own loop in a daemon thread."""

from __future__ import annotations

import asyncio
import socket
import threading

from aiohttp import web

from deltabus._server_thread import ServerThread


def _left_by_its_client(handler) -> ServerThread:
    """A server whose `handler` is running for a client that sent one request and went away."""
    entered = threading.Event()

    async def handle(request: web.Request) -> web.Response:
        entered.set()
        return await handler(request)

    app = web.Application()
    app.router.add_post("/", handle)
    server = ServerThread(app).start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
        assert entered.wait(10)
    return server


def test_stop_ends_a_handler_whose_client_went_away_and_closes_the_loop() -> None:
    """A pusher killed mid-request leaves its handler waiting: aiohttp's cleanup no longer
    tracks it. stop() must still end it (seen: 156 "Task was destroyed but it is pending!"
    printed at the exit of a test session, after a push job was killed mid-push)."""
    ended = []

    async def hold(request: web.Request) -> web.Response:
        try:
            await asyncio.sleep(3600)  # answers far too late
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        return web.Response()

    server = _left_by_its_client(hold)  # the client is gone; its handler still sleeps
    server.stop()
    assert ended == ["cancelled"]
    server.stop()  # again: nothing to do
    server.call_soon(lambda: None)  # after the stop: nothing, no error


def test_stop_returns_when_a_handler_ignores_its_cancellation() -> None:
    async def stubborn(request: web.Request) -> web.Response:
        for _ in range(2):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # swallowed once; the loop closes after CANCEL_GRACE regardless
        return web.Response()

    server = _left_by_its_client(stubborn)
    server.stop()
    server.call_soon(lambda: None)


def test_a_server_that_could_not_start_raises_and_stops_quietly() -> None:
    taken = ServerThread(web.Application()).start()
    try:
        again = ServerThread(web.Application(), port=taken.port)
        try:
            again.start()
        except OSError:
            pass
        else:
            raise AssertionError("a second server bound the same port")
        again.stop()  # nothing to stop; returns at once
    finally:
        taken.stop()
