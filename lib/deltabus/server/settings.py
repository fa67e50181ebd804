"""ServeSettings: what `deltabus serve` listens on and where its warehouse is.

Resolved once at the entry point (the CLI) and passed down; nothing here reads the
environment. Rules, checked in ``__post_init__`` (an error names the field):

- ``host`` defaults to 127.0.0.1. A host that is not a loopback address (``0.0.0.0``, a
  LAN address, a name other than ``localhost``) needs TLS (``tls_cert`` and ``tls_key``)
  unless ``insecure=True`` says plain text on the network is meant: Pub/Sub clients send
  payloads in the clear over an emulator channel.
- ``port`` is 0..65535; 0 lets the system pick a free port (the bound port is reported).
- ``tls_cert`` and ``tls_key`` come together (PEM files, read when the server starts).
- ``threads``: the pool that runs blocking Delta work (1..256), so it never blocks the
  event loop; ``grace_seconds``: how long a stop waits for calls in flight.
- ``defer_seconds`` (0 < s <= 60): the longest an outcome answered before its commit (a
  client's receipt modack, a journaled ack: ``server.ack_journal``) waits to ride in a
  round with others before it goes on its own. Longer: fewer ack MERGEs, and fewer acks
  journaled (a lease must outlast the deferral by ``streaming.ACK_LEASE_MARGIN``); a
  journaled ack a crash left uncommitted is applied when a server next starts on the
  warehouse.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from ..errors import InvalidArgument

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and the usual loopback names."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class ServeSettings:
    warehouse: str
    port: int
    host: str = "127.0.0.1"
    tls_cert: str | None = None
    tls_key: str | None = None
    insecure: bool = False
    allow_http: bool = False  # push endpoints over plain http (as the clients' allow_http)
    threads: int = 16
    grace_seconds: float = 5.0
    history: bool = True  # record the delivery history (issue 17) of the leases, acks and nacks served
    defer_seconds: float = 0.5

    def __post_init__(self) -> None:
        if not isinstance(self.warehouse, str) or not self.warehouse:
            raise InvalidArgument("warehouse", "must be a non-empty path or URI")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise InvalidArgument("port", f"must be an integer 0..65535, got {self.port!r}")
        if not isinstance(self.host, str) or not self.host or any(c.isspace() for c in self.host):
            raise InvalidArgument("host", f"must be a host name or address, got {self.host!r}")
        for name in ("tls_cert", "tls_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgument(name, f"must be a path to a PEM file, got {value!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            missing = "tls_key" if self.tls_key is None else "tls_cert"
            raise InvalidArgument(missing, "tls_cert and tls_key must be given together")
        if not isinstance(self.insecure, bool):
            raise InvalidArgument("insecure", "must be a boolean")
        if not isinstance(self.allow_http, bool):
            raise InvalidArgument("allow_http", "must be a boolean")
        if not self.tls and not self.insecure and not is_loopback(self.host):
            raise InvalidArgument(
                "host",
                f"{self.host} is not a loopback address: serving on it needs tls_cert and tls_key, "
                "or insecure=True to accept plain text on the network",
            )
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or not 1 <= self.threads <= 256:
            raise InvalidArgument("threads", f"must be an integer 1..256, got {self.threads!r}")
        if not isinstance(self.history, bool):
            raise InvalidArgument("history", "must be a boolean")
        d = self.defer_seconds
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or not 0 < d <= 60:
            raise InvalidArgument("defer_seconds", f"must be a number of seconds > 0 and <= 60, got {d!r}")
        g = self.grace_seconds
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or g < 0:
            raise InvalidArgument("grace_seconds", f"must be a finite number of seconds >= 0, got {g!r}")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def address(self) -> str:
        """host:port as grpc binds it (an IPv6 address in brackets)."""
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"
