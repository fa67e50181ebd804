"""A push endpoint on 127.0.0.1 for demos and notebooks: acks every push and keeps what it got."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Literal

from aiohttp import web

from .._server_thread import ServerThread
from ..errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Push:
    message_id: str
    data: bytes
    attributes: dict[str, str]
    delivery_attempt: int
    received_at: float  # seconds since the epoch, when the endpoint read the request


class LocalEndpoint:
    """Answers `status` to wrapped pushes and keeps them (``ep.pushes``).

    ``with LocalEndpoint() as ep: ... ep.url ...``, or, where one block cannot hold it (a
    notebook's cells), ``ep = LocalEndpoint().start()`` ... ``ep.stop()``.
    """

    def __init__(
        self,
        status: int = 204,
        *,
        clock: Callable[[], float] = time.time,
        fail_ratio: float = 0.0,
        fail_status: int = 503,
        seed: int | None = None,
    ) -> None:
        """`fail_ratio` (0..1): the share of pushes answered `fail_status` instead of `status`
        (a flaky endpoint), drawn at random (`seed` for a repeatable run)."""
        if isinstance(fail_ratio, bool) or not isinstance(fail_ratio, (int, float)) or not 0.0 <= fail_ratio <= 1.0:
            raise InvalidArgument("fail_ratio", f"must be a number 0..1, got {fail_ratio!r}")
        for name, value in (("status", status), ("fail_status", fail_status)):
            if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= 599:
                raise InvalidArgument(name, f"must be an HTTP status 100..599, got {value!r}")
        self.status = status
        self.fail_ratio = float(fail_ratio)
        self.fail_status = fail_status
        self._random = random.Random(seed)
        self._clock = clock
        self._state: Literal["new", "running", "stopped"] = "new"
        self._pushes: list[Push] = []
        self._lock = threading.Lock()
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_post("/push", self._handle)
        self._server = ServerThread(app, name="deltabus-local-endpoint")

    @property
    def url(self) -> str:
        if self._state != "running":
            raise RuntimeError(f"the endpoint is {'not started' if self._state == 'new' else 'stopped'}: it has no URL")
        return f"http://127.0.0.1:{self._server.port}/push"

    @property
    def pushes(self) -> list[Push]:
        with self._lock:
            return list(self._pushes)

    async def _handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        m = body["message"]
        push = Push(m["messageId"], base64.b64decode(m.get("data", "")), m.get("attributes", {}), body.get("deliveryAttempt", 1),
                    self._clock())
        with self._lock:
            self._pushes.append(push)
            failed = self.fail_ratio > 0 and self._random.random() < self.fail_ratio
        return web.Response(status=self.fail_status if failed else self.status)

    def start(self) -> "LocalEndpoint":
        """Listen on a free port of 127.0.0.1; returns the endpoint. An endpoint starts once."""
        if self._state != "new":
            raise RuntimeError(f"the endpoint was already {'started' if self._state == 'running' else 'stopped'}")
        self._server.start()
        self._state = "running"
        return self

    def stop(self) -> None:
        """Close the port. Idempotent; what was received stays in ``pushes``."""
        if self._state == "running":
            self._server.stop()
        self._state = "stopped"

    def __enter__(self) -> "LocalEndpoint":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
