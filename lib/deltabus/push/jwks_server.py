"""Serves the push signing key's JWKS (and an OpenID discovery document) over HTTP."""

from __future__ import annotations

from typing import Callable, Mapping

from aiohttp import web

from .._server_thread import ServerThread


class JwksServer:
    """/jwks.json, /.well-known/jwks.json and /.well-known/openid-configuration."""

    def __init__(self, jwks: Callable[[], Mapping[str, object]], issuer: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self._jwks = jwks
        self._issuer = issuer
        app = web.Application()
        app.router.add_get("/jwks.json", self._keys)
        app.router.add_get("/.well-known/jwks.json", self._keys)
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        self._server = ServerThread(app, host, port, name="deltabus-jwks")

    @property
    def jwks_uri(self) -> str:
        return f"http://{self._server.host}:{self._server.port}/jwks.json"

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

    def start(self) -> "JwksServer":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
