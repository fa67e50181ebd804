"""The benchmark's push endpoint: an acking aiohttp server in its own process on 127.0.0.1.

It counts requests and records the first and last arrival; with ``track_ids`` it also
records when each message id first arrived (for publish -> push latency).
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any


def _serve(port_queue: Any, conn: Any, track_ids: bool) -> None:  # pragma: no cover - child process
    import asyncio
    import json
    import threading

    from aiohttp import web

    state = {"count": 0, "first": 0.0, "last": 0.0}
    seen: dict[str, float] = {}

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        if not state["count"]:
            state["first"] = now
        state["count"] += 1
        state["last"] = now
        if track_ids:
            mid = json.loads(body)["message"]["messageId"]
            seen.setdefault(mid, now)
        return web.Response(status=204)

    def control(loop: asyncio.AbstractEventLoop) -> None:
        while True:
            cmd = conn.recv()
            if cmd == "stats":
                fut = asyncio.run_coroutine_threadsafe(_stats(), loop)
                conn.send(fut.result())
            elif cmd == "reset":
                asyncio.run_coroutine_threadsafe(_reset(), loop).result()
                conn.send("ok")

    async def _stats() -> dict[str, Any]:
        return {**state, "seen": dict(seen) if track_ids else {}}

    async def _reset() -> None:
        state.update(count=0, first=0.0, last=0.0)
        seen.clear()

    async def main() -> None:
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_route("POST", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port_queue.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        threading.Thread(target=control, args=(asyncio.get_running_loop(),), daemon=True).start()
        await asyncio.Event().wait()

    asyncio.run(main())


class BenchEndpoint:
    def __init__(self, *, track_ids: bool = False) -> None:
        self.track_ids = track_ids

    def __enter__(self) -> "BenchEndpoint":
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(q, child, self.track_ids), daemon=True)
        self._proc.start()
        self.port = q.get(timeout=30)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    def stats(self) -> dict[str, Any]:
        self._conn.send("stats")
        return self._conn.recv()

    def reset(self) -> None:
        self._conn.send("reset")
        self._conn.recv()

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.join(5)
