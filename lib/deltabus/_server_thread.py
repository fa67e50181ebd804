"""An aiohttp web application served on its own event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Callable

from aiohttp import web


# Seconds handlers cancelled at stop (their clients gone) get to end before the loop closes.
CANCEL_GRACE = 2.0


class ServerThread:
    """``ServerThread(app, host, port).start()``; ``.port`` is the bound port (0 picks a free one).
    With `ssl_context` it serves HTTPS only (a plain-HTTP request on that port fails its handshake)."""

    def __init__(
        self,
        app: web.Application,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        name: str = "deltabus-http",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self._ssl_context = ssl_context
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._stopping = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024, ssl_context=self._ssl_context)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # (host, port[, ...]) of the one site

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:  # e.g. the port is taken: report it from start()
            self._error = exc
            self._loop.close()
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        # stop() ran the runner's cleanup, which ends the handlers of the connections it still
        # tracks. One whose client went away (a pusher killed mid-request) is no longer
        # tracked and may still wait: it is cancelled here, given CANCEL_GRACE to end, and the
        # loop closed. Left pending, such tasks were destroyed with the loop at interpreter
        # exit, each printing "Task was destroyed but it is pending!" (156 of them after a
        # test session, 2026-11-27).
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_GRACE))
        self._loop.close()

    def start(self) -> "ServerThread":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the HTTP server on {self.host}:{self.port} did not start")
        if self._error is not None:
            raise self._error
        return self

    def call_soon(self, fn: "Callable[[], object]") -> None:
        """Run `fn` on the server's event loop (from any thread); nothing once it stopped."""
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: the server stopped
            pass

    def stop(self) -> None:
        """Stop serving and wait for the thread (at most about 10 s plus CANCEL_GRACE).
        Idempotent and safe from several threads; not from the server's own loop."""
        with self._stopping:
            if not self._thread.is_alive() or self._loop.is_closed() or self._error is not None:
                return
            if self._runner is not None:
                try:
                    asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
                except Exception:
                    pass
            self.call_soon(self._loop.stop)
            self._thread.join(10 + CANCEL_GRACE)
