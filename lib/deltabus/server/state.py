"""ServerState: what every service of `deltabus serve` shares, made once per server.

Contract (the services and ``streaming.handle_streaming_pull`` rely on it):

- ``engine``: the warehouse's delta-rs engine (never Spark), opened once; ``registry`` its
  topic and subscription registry; ``clock``: wall-clock seconds.
- ``publisher`` / ``subscriber``: deltabus's own clients over that engine, so the gRPC
  calls reuse their request validation and name rules (``request=`` dicts).
- ``run(fn, *args)``: await a blocking call (any delta-rs work) on ``executor``, the
  server's thread pool (``ServeSettings.threads``); the event loop never blocks on Delta.
- ``LeasedMessage``: a leased message as the unary Pull answers it (the group commit
  leases: ``server.group_commit``).
- ``watch_uris`` / ``versions()``: the messages and deliveries tables followed by this
  process's log watcher; ``versions()`` is a stat of the local logs (cheap, non-blocking
  enough for the loop), so a waiter re-reads only after a commit (or a time bound, since
  lease expiries make no commit).
- ``stopping``: an asyncio.Event set when the server begins to stop; open streams end
  with UNAVAILABLE so clients reconnect elsewhere or later.
- ``fault``: for tests only (None in every server ``deltabus serve`` starts; nothing reads
  the environment for it). A ``FaultHook`` the unary methods' wrapper (``calls.rpc``)
  calls with the method's name and the stage: ``"before"`` the method runs (nothing is
  written yet) and ``"after"`` it ran (its commit is made, its response not yet sent). A
  status code returned fails the call with it, so a test can show what the clients'
  retries do when a call fails at either point.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, NamedTuple, TypeVar

import grpc

from .. import names, watch
from ..publisher.client import PublisherClient
from ..registry import Registry, SubscriptionRecord
from ..storage import Engine
from ..subscriber.client import SubscriberClient
from .ack_journal import AckJournal
from .settings import ServeSettings

T = TypeVar("T")
# The Python client's emulator channel has grpc's default 4 MiB receive limit (FACTS.md):
# a Pull or StreamingPull response must stay below it, with room for framing.
RESPONSE_LIMIT = 4 * 1024 * 1024 - 64 * 1024
MESSAGE_OVERHEAD = 64  # bytes per message for tags, lengths, the publish time and the attempt

FaultStage = Literal["before", "after"]
# (method name, stage) -> a status code to fail the call with, or None to let it be.
FaultHook = Callable[[str, FaultStage], "grpc.StatusCode | None"]


class LeasedMessage(NamedTuple):
    """One leased message with its payload, ready for a Pull or StreamingPull response."""

    ack_id: str
    message_id: str
    data: bytes
    attributes: dict[str, str]
    publish_time: Any  # datetime (UTC) or None
    ordering_key: str
    delivery_attempt: int
    size: int  # data + attribute bytes, for flow control and response limits


@dataclass(slots=True)
class ServerState:
    settings: ServeSettings
    engine: Engine
    registry: Registry
    publisher: PublisherClient
    subscriber: SubscriberClient
    executor: ThreadPoolExecutor
    watch_uris: list[str]
    watcher: watch.LogWatcher
    clock: Callable[[], float] = time.time
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    fault: FaultHook | None = None  # tests only (see the module docstring)
    acks: AckJournal | None = None  # local warehouses: acks answered before their commit (ack_journal)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def versions(self) -> dict[str, int]:
        return self.watcher.current(self.watch_uris)

    def subscription(self, name: str, field_name: str = "subscription") -> SubscriptionRecord:
        """The live subscription `name` (InvalidArgument for a malformed name, NotFound)."""
        return self.registry.subscription(str(names.parse_subscription(name, field_name)))


def split_for_response(leased: list[LeasedMessage], limit: int = RESPONSE_LIMIT) -> tuple[list[LeasedMessage], list[LeasedMessage]]:
    """The leading messages whose response stays under `limit` bytes (at least one), and the
    rest, to give back. An estimate from above: payload + ids + a per-message allowance."""
    total = 0
    for i, m in enumerate(leased):
        total += m.size + len(m.ack_id) + len(m.message_id) + len(m.ordering_key) + MESSAGE_OVERHEAD
        if total > limit and i > 0:
            return leased[:i], leased[i:]
    return leased, []


def watch_tables(engine: Engine, watcher: watch.LogWatcher) -> list[str]:
    """Register the messages and deliveries tables with `watcher`; return their URIs."""
    uris = []
    for table in ("messages", "deliveries"):
        uri = engine.table_uri(table)
        watcher.watch(uri, functools.partial(engine.version, table))
        uris.append(uri)
    return uris
