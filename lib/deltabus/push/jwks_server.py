"""Serves the push signing key's JWKS (and an OpenID discovery document) over HTTP."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from aiohttp import web


class JwksServer:
    """A small aiohttp server in a daemon thread: /jwks.json and /.well-known/openid-configuration."""

    def __init__(self, jwks: Callable[[], dict], issuer: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self._jwks = jwks
        self._issuer = issuer
        self.host = host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deltabus-jwks", daemon=True)

    @property
    def jwks_uri(self) -> str:
        return f"http://{self.host}:{self.port}/jwks.json"

    async def _keys(self, _: web.Request) -> web.Response:
        return web.json_response(self._jwks())

    async def _discovery(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self._issuer,
                "jwks_uri": self.jwks_uri,
                "id_token_signing_alg_values_supported": ["RS256"],
                "subject_types_supported": ["public"],
                "response_types_supported": ["id_token"],
                "claims_supported": ["aud", "azp", "email", "email_verified", "exp", "iat", "iss", "sub"],
            }
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/jwks.json", self._keys)
        app.router.add_get("/.well-known/jwks.json", self._keys)
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> "JwksServer":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the JWKS server did not start")
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
