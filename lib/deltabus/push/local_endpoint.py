"""A push endpoint on 127.0.0.1 for demos and notebooks: acks every push and keeps what it got."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Push:
    message_id: str
    data: bytes
    attributes: dict[str, str]
    delivery_attempt: int


class LocalEndpoint:
    """``with LocalEndpoint() as ep: ... ep.url ... ep.pushes``. Answers 204 to wrapped pushes."""

    def __init__(self, status: int = 204) -> None:
        self.status = status
        self._pushes: list[Push] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="deltabus-local-endpoint", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    @property
    def pushes(self) -> list[Push]:
        with self._lock:
            return list(self._pushes)

    async def _handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        m = body["message"]
        push = Push(m["messageId"], base64.b64decode(m.get("data", "")), m.get("attributes", {}), body.get("deliveryAttempt", 1))
        with self._lock:
            self._pushes.append(push)
        return web.Response(status=self.status)

    async def _start(self) -> None:
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_post("/push", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> "LocalEndpoint":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the local endpoint did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
