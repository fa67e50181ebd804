"""`deltabus serve`: the ``google.pubsub.v1`` gRPC services on a ``grpc.aio`` server.

No protos are compiled or vendored: each method is a grpcio generic handler whose
(de)serializers are the proto-plus classes' ``serialize``/``deserialize`` from
google-cloud-pubsub (``google.pubsub_v1.types``), and ``google.protobuf.Empty`` for the
methods that return nothing. Method paths are ``/google.pubsub.v1.Publisher/NAME`` and
``/google.pubsub.v1.Subscriber/NAME``.

Life cycle: ``start`` opens the warehouse with the delta-rs engine (creating it when
missing; Spark is never started), builds the ``ServerState`` and binds the port (0 picks
a free one). ``Server.stop`` sets ``state.stopping`` (streams end with UNAVAILABLE), stops
the server with ``grace_seconds`` for calls in flight, then shuts the thread pool.
``serve`` runs until SIGTERM or SIGINT, after writing exactly one ready line
``serving google.pubsub.v1 on HOST:PORT, warehouse PATH``. ``ServerThread`` runs a server on
its own loop in a thread (tests, notebooks).

Requests up to MAX_REQUEST_BYTES are accepted by the transport, so an oversize message is
answered by the library's own limit (INVALID_ARGUMENT naming the field), not by grpc.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import grpc
import grpc.aio
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as pb

from .. import ackid, watch
from ..delivery.history import OFF, HistorySettings
from ..errors import InvalidArgument
from ..publisher.client import PublisherClient
from ..registry import Registry
from ..policy.clock_skew import ClockSkewPolicy
from ..storage import Engine, open_engine
from ..storage.clock import StorageClock, resolve_clock, wall
from ..subscriber.client import SubscriberClient
from . import ack_journal, group_commit, streaming
from .ack_journal import AckJournal
from .calls import request_deserializer
from .publisher_service import PublisherService
from .settings import ServeSettings
from .state import ServerState, watch_tables
from .subscriber_service import SubscriberService

log = logging.getLogger(__name__)

PUBLISHER = "google.pubsub.v1.Publisher"
SUBSCRIBER = "google.pubsub.v1.Subscriber"
# Pub/Sub's request limit is 10 MB; room above it so the library's limit answers first.
MAX_REQUEST_BYTES = 16 * 1024 * 1024


class Method(NamedTuple):
    name: str
    request: Any  # a proto-plus message class
    response: Any  # a proto-plus message class, or empty_pb2.Empty


PUBLISHER_METHODS = (
    Method("CreateTopic", pb.Topic, pb.Topic),
    Method("UpdateTopic", pb.UpdateTopicRequest, pb.Topic),
    Method("Publish", pb.PublishRequest, pb.PublishResponse),
    Method("GetTopic", pb.GetTopicRequest, pb.Topic),
    Method("ListTopics", pb.ListTopicsRequest, pb.ListTopicsResponse),
    Method("ListTopicSubscriptions", pb.ListTopicSubscriptionsRequest, pb.ListTopicSubscriptionsResponse),
    Method("ListTopicSnapshots", pb.ListTopicSnapshotsRequest, pb.ListTopicSnapshotsResponse),
    Method("DeleteTopic", pb.DeleteTopicRequest, empty_pb2.Empty),
    Method("DetachSubscription", pb.DetachSubscriptionRequest, pb.DetachSubscriptionResponse),
)
SUBSCRIBER_METHODS = (
    Method("CreateSubscription", pb.Subscription, pb.Subscription),
    Method("GetSubscription", pb.GetSubscriptionRequest, pb.Subscription),
    Method("UpdateSubscription", pb.UpdateSubscriptionRequest, pb.Subscription),
    Method("ListSubscriptions", pb.ListSubscriptionsRequest, pb.ListSubscriptionsResponse),
    Method("DeleteSubscription", pb.DeleteSubscriptionRequest, empty_pb2.Empty),
    Method("ModifyAckDeadline", pb.ModifyAckDeadlineRequest, empty_pb2.Empty),
    Method("Acknowledge", pb.AcknowledgeRequest, empty_pb2.Empty),
    Method("Pull", pb.PullRequest, pb.PullResponse),
    Method("ModifyPushConfig", pb.ModifyPushConfigRequest, empty_pb2.Empty),
    Method("GetSnapshot", pb.GetSnapshotRequest, pb.Snapshot),
    Method("ListSnapshots", pb.ListSnapshotsRequest, pb.ListSnapshotsResponse),
    Method("CreateSnapshot", pb.CreateSnapshotRequest, pb.Snapshot),
    Method("UpdateSnapshot", pb.UpdateSnapshotRequest, pb.Snapshot),
    Method("DeleteSnapshot", pb.DeleteSnapshotRequest, empty_pb2.Empty),
    Method("Seek", pb.SeekRequest, pb.SeekResponse),
)


def _serializer(cls: Any) -> Callable[[Any], bytes]:
    if cls is empty_pb2.Empty:
        return lambda message: bytes(message.SerializeToString())
    return lambda message: bytes(cls.serialize(message))


def _deserializer(cls: Any) -> Callable[[bytes], Any]:
    if cls is empty_pb2.Empty:
        return lambda data: empty_pb2.Empty.FromString(data)
    return lambda data: cls.deserialize(data)


def _unary(service: object, m: Method) -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_unary_rpc_method_handler(
        getattr(service, m.name), request_deserializer=request_deserializer(m.request), response_serializer=_serializer(m.response)
    )


def handlers(state: ServerState) -> list[grpc.GenericRpcHandler]:
    publisher, subscriber = PublisherService(state), SubscriberService(state)
    pub = {m.name: _unary(publisher, m) for m in PUBLISHER_METHODS}
    sub = {m.name: _unary(subscriber, m) for m in SUBSCRIBER_METHODS}

    # An async generator function itself: grpc.aio tells streaming handlers apart by
    # inspect.isasyncgenfunction, so a plain function returning one is not served.
    async def streaming_pull(request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async for response in streaming.handle_streaming_pull(state, request_iterator, context):
            yield response

    sub["StreamingPull"] = grpc.stream_stream_rpc_method_handler(
        streaming_pull,
        request_deserializer=_deserializer(pb.StreamingPullRequest),
        response_serializer=_serializer(pb.StreamingPullResponse),
    )
    return [grpc.method_handlers_generic_handler(PUBLISHER, pub), grpc.method_handlers_generic_handler(SUBSCRIBER, sub)]


def _credentials(settings: ServeSettings) -> grpc.ServerCredentials | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    with open(settings.tls_key, "rb") as key, open(settings.tls_cert, "rb") as cert:
        return grpc.ssl_server_credentials([(key.read(), cert.read())])


class Server:
    """A started server: ``port`` is the bound port; ``stop()`` ends it (see the module doc)."""

    def __init__(self, server: grpc.aio.Server, state: ServerState, port: int) -> None:
        self.server = server
        self.state = state
        self.port = port

    @property
    def ready_line(self) -> str:
        s = self.state.settings
        host = f"[{s.host}]" if ":" in s.host and not s.host.startswith("[") else s.host
        return f"serving google.pubsub.v1 on {host}:{self.port}, warehouse {s.warehouse}"

    async def stop(self) -> None:
        self.state.stopping.set()
        await self.server.stop(self.state.settings.grace_seconds)
        # Rounds and stream acks still committing finish (or are cancelled after the grace
        # period) before the loop closes: a task left pending was destroyed with the loop,
        # and its commit cut at an arbitrary point ("Task was destroyed but it is pending").
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if pending:
            _, left = await asyncio.wait(pending, timeout=max(1.0, self.state.settings.grace_seconds))
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(None, self._close)

    def _close(self) -> None:
        self.state.executor.shutdown(wait=True)
        self.state.publisher.close()
        self.state.subscriber.close()


def journal_dir(warehouse: str) -> str:
    """Where a local warehouse's servers keep their ack journals (``ack_journal``)."""
    return os.path.join(warehouse, "_deltabus", "serve-acks")


def open_journal(
    engine: Engine, registry: Registry, clock: Callable[[], float], history: HistorySettings = OFF,
) -> AckJournal | None:
    """Apply the acks of journals left by servers that are gone (recorded in the delivery
    history when `history` is on, as the server's own acks are), then open this server's
    own; None for a warehouse given as a URI (an object store, or ``file://``: its acks
    commit before they are answered)."""
    if "://" in engine.warehouse:
        return None
    directory = journal_dir(engine.warehouse)

    def apply(name: str, encoded: list[str]) -> None:
        ids = []
        for x in encoded:
            try:
                ids.append(ackid.decode(x))
            except InvalidArgument:  # not an ack id this code reads: nothing to apply
                log.warning("ack journal: skipped an ack id that does not parse")
        try:
            sub = registry.subscription(name)
            group_commit.run_round(engine, sub, [group_commit.OutcomeAsk(tuple(ids), None)], clock, history=history)
        except Exception as exc:  # deleted or detached since (its backlog dropped): the acks are moot
            if not group_commit.ack_moot(exc):
                raise

    ack_journal.recover(directory, apply)
    return AckJournal(directory)


async def start(
    settings: ServeSettings, *, clock: Callable[[], float] | None = None, clock_skew: ClockSkewPolicy | None = None
) -> Server:
    """Open the warehouse (delta-rs; created when missing) and start serving.

    The server keeps one clock for everything it does (``storage.clock.resolve_clock``):
    without `clock`, the storage's time, so its leases hold against pullers elsewhere
    whose clocks are off; its clients share it."""
    credentials = _credentials(settings)  # a missing or unreadable PEM file fails before anything opens
    executor = ThreadPoolExecutor(max_workers=settings.threads, thread_name_prefix="deltabus-serve")
    loop = asyncio.get_running_loop()

    def open_state() -> ServerState:
        engine = open_engine(settings.warehouse, engine="delta-rs", create=True)
        kept = resolve_clock(clock, clock_skew)
        if isinstance(kept, StorageClock):
            kept.attach(engine)
        watcher = watch.watcher()
        registry = Registry(engine, clock=wall(kept))
        journal = open_journal(engine, registry, kept, HistorySettings(enabled=settings.history))
        return ServerState(
            settings=settings,
            engine=engine,
            registry=registry,
            publisher=PublisherClient(engine=engine, clock=kept),
            subscriber=SubscriberClient(engine=engine, clock=kept, allow_http=settings.allow_http),
            executor=executor,
            watch_uris=watch_tables(engine, watcher),
            watcher=watcher,
            clock=kept,
            acks=journal,
        )

    try:
        state = await loop.run_in_executor(executor, open_state)
    except BaseException:
        executor.shutdown(wait=False)
        raise
    streaming.hub_for(state)  # made here, on the server's loop: its watcher thread and the group commit
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES), ("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers(handlers(state))
    if credentials is None:
        port = server.add_insecure_port(settings.address)
    else:
        port = server.add_secure_port(settings.address, credentials)
    await server.start()
    return Server(server, state, port)


async def serve(settings: ServeSettings, announce: Callable[[str], None]) -> None:
    """Serve until SIGTERM or SIGINT; `announce` gets the one ready line."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await start(settings)
    try:
        announce(server.ready_line)
        await stop.wait()
    finally:
        await server.stop()


class ServerThread:
    """A server on its own event loop in a daemon thread: ``ServerThread(settings).start()``,
    then ``.port``, ``.state``; ``stop()`` stops it and waits for the thread."""

    def __init__(self, settings: ServeSettings, *, clock: Callable[[], float] | None = None) -> None:
        self.settings = settings
        self._clock = clock
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.server: Server | None = None
        self._thread = threading.Thread(target=self._run, name="deltabus-serve", daemon=True)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def state(self) -> ServerState:
        assert self.server is not None
        return self.server.state

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            self.server = await start(self.settings, clock=self._clock)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.server.stop()

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    def start(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            stop = self._stop
            self._loop.call_soon_threadsafe(stop.set)
        self._thread.join()
