"""A push endpoint on 127.0.0.1 for demos and notebooks: acks every push and keeps what it got."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass

from aiohttp import web

from .._server_thread import ServerThread


@dataclass(frozen=True, slots=True)
class Push:
    message_id: str
    data: bytes
    attributes: dict[str, str]
    delivery_attempt: int


class LocalEndpoint:
    """``with LocalEndpoint() as ep: ... ep.url ... ep.pushes``. Answers `status` to wrapped pushes."""

    def __init__(self, status: int = 204) -> None:
        self.status = status
        self._pushes: list[Push] = []
        self._lock = threading.Lock()
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_post("/push", self._handle)
        self._server = ServerThread(app, name="deltabus-local-endpoint")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/push"

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

    def __enter__(self) -> "LocalEndpoint":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
