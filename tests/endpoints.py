"""Real push endpoints for tests: aiohttp servers on 127.0.0.1 in a background thread."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from aiohttp import web

from deltabus._server_thread import ServerThread


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Behaviour:
    """Decides each answer: (status, seconds to sleep first)."""

    respond: Callable[[Received, int], tuple[int, float]] = lambda r, n: (204, 0.0)


class Endpoint:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.received: list[Received] = []
        self._lock = threading.Lock()
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        self._server = ServerThread(app, name="test-endpoint")

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    async def _handle(self, request: web.Request) -> web.Response:
        r = Received(request.path, dict(request.headers), await request.read(), time.time())
        with self._lock:
            self.received.append(r)
            n = len(self.received)
        status, delay = self.behaviour.respond(r, n)
        if delay:
            await asyncio.sleep(delay)
        return web.Response(status=status)

    def __enter__(self) -> "Endpoint":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)


def _serve_forever(port_queue, counter) -> None:  # pragma: no cover - runs in a child process
    import asyncio as _asyncio

    from aiohttp import web as _web

    async def handle(request: _web.Request) -> _web.Response:
        await request.read()
        with counter.get_lock():
            counter.value += 1
        return _web.Response(status=204)

    async def main() -> None:
        app = _web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_route("POST", "/{tail:.*}", handle)
        runner = _web.AppRunner(app, access_log=None)
        await runner.setup()
        site = _web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_queue.put(runner.addresses[0][1])
        await _asyncio.Event().wait()

    _asyncio.run(main())


class ProcessEndpoint:
    """An acking endpoint in its own process (no GIL shared with Spark's driver), counting requests."""

    def __enter__(self) -> "ProcessEndpoint":
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        self.count = ctx.Value("q", 0)
        self._proc = ctx.Process(target=_serve_forever, args=(q, self.count), daemon=True)
        self._proc.start()
        self.port = q.get(timeout=30)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    @property
    def received(self) -> int:
        return self.count.value

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.join(5)
