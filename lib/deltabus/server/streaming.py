"""StreamingPull of `deltabus serve`, on grpc.aio: no thread per stream.

Contract.

- **The first request** names the subscription and ``stream_ack_deadline_seconds``
  (10..600, INVALID_ARGUMENT otherwise; a later request may change it: leases granted
  after that last that long), ``max_outstanding_messages`` and ``max_outstanding_bytes``
  (0 = no limit). A missing subscription ends the stream with NOT_FOUND, a push one with
  FAILED_PRECONDITION (the client gives up on both). Later requests carry acks
  (``ack_ids``), deadline changes (``modify_deadline_ack_ids`` with the same number of
  ``modify_deadline_seconds``; 0 is a nack) or nothing (a heartbeat).
- **Leases** come from the server's group commit (``group_commit.GroupCommits``): a
  stream with room (``policy.stream_flow``) asks for that many; its leases end
  ``stream_ack_deadline_seconds`` after the round. Responses stay under the client's
  4 MiB limit (several responses for one round when needed) and carry
  ``subscription_properties``: message ordering, and exactly-once delivery as the record
  read by the round that leased the response's messages says (so an update reaches an open
  stream with its next messages; the stream remembers what it last told its client,
  ``_Stream.exactly_once``). The core's lease selection already keeps ordering keys in
  order; a round's leases of one key go to one stream and are sent in lease order.
- **Exactly-once** (issue 15). google-cloud-pubsub, told a subscription is exactly-once,
  sends its acks and deadline changes (its receipt modack too, whose failure drops the
  message before the callback) as unary Acknowledge / ModifyAckDeadline calls and reads a
  result per ack id from their error status. Those go through ``StreamHub`` with
  ``results=True``: the group commit then reads the rows first and answers per id when
  the subscription is exactly-once (``GroupCommits``' ``results_if_exactly_once``), and a
  deadline change of an id held by an exactly-once stream is never answered before its
  round (the early answer below confirms nothing). A change that did not apply frees its
  id on the stream at once (the id names no current delivery). Acks and changes sent on
  the stream itself report nothing, so they ask for no results (no read); the core's
  clauses still apply only those naming the current delivery.
- **Acks answered from the journal** (``StreamHub._journaled``, ``ack_journal``). An ack
  (unary or on the stream) of ids all leased to this server's streams, none exactly-once
  or ordered, is written to the server's ack journal and answered; it commits deferred, in
  the subscription's next round with other outcomes or after ``defer_seconds``. The
  journal's next start applies what a crash left uncommitted, and a clean stop commits it
  first (``GroupCommits.flush``). Any other ack commits before it is answered, as does
  every ack on a warehouse in an object store (no journal there).
- **Flow control.** A message is outstanding on its stream from its lease until its ack
  id is acked or nacked (on the stream, or by a unary Acknowledge / ModifyAckDeadline,
  which go through ``StreamHub`` too: it maps every outstanding ack id to its stream) or
  its lease runs out; an extension moves its end.
- **Wake-ups, no per-stream polling.** A stream that got nothing, or whose round leased
  all there was (``Granted.more`` False), waits on its own event.
  It is set by (1) the server's own Publish commits (``StreamHub.published(topic_uid)``:
  the streams of that topic); (2) ONE watcher thread per server, following the messages
  table's log through the process's ``watch.LogWatcher`` (other writers' publishes; a
  stat of the log every 20 ms; versions this server appended itself wake nobody, since
  (1) did: ``own_commits``); (3) a nack through the hub (the streams of that
  subscription, after the nack's round); (4) its own acks freeing flow room, and with
  message ordering the ack's commit too (until then the acked messages hold their keys,
  so a lease asked at once finds nothing of them). Measured through subscribe() with 3
  keys and FlowControl 20: 28 msg/s before this wake-up, 35 after; the rest is the core's
  rule that a key with a message outstanding is not leased, with the client acking its
  ordered messages one callback at a time (rounds of 1-3 acks). Lease
  expiries and other processes' nacks make no message commit, so a waiting stream also
  re-asks every ``IDLE_RECHECK`` seconds; the group commit folds those asks of one
  subscription into one round.
- **Seek** (``StreamHub.sought``, called by the Seek method once the seek committed). A
  seek ends every lease of the subscription in the table: each row is dropped or kept with
  the stale mark, so the ack ids handed out before it no longer apply (an ack or deadline
  change of one is ignored by the MERGE). What the hub held for those ids would otherwise
  outlive them: they counted against their stream's flow control until the client settled
  them or their (extended) lease ran out, so a stream at its limit got no replayed message
  before that; their durable ends no longer held; and, since a seek commits to the
  deliveries table only, the watcher does not see it, so waiting streams asked again only
  at their IDLE_RECHECK. So the subscription's streams forget every id they hold and are
  woken. A lease round in flight across the seek may have committed before it (its
  leases are dead) or after it (live): its messages are still sent, but not counted on
  the stream (``seek_epoch`` changed meanwhile), which at worst lets one round's messages
  pass the client's flow limit, never holds a replay back. A seek made by another process
  is seen only at the streams' IDLE_RECHECK, and its dead ids free as the client settles
  them or their leases run out.
- **Breaks and stops.** A stream that breaks keeps nothing: its leases run out and the
  messages come back. When the server stops (``ServerState.stopping``) every open stream
  ends with UNAVAILABLE, so clients reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

import grpc
import grpc.aio
from google.pubsub_v1 import types as pb

from .. import ackid, names
from ..activity import ActivityRecorder
from ..delivery.model import IdResult, Result
from ..errors import FailedPrecondition, InvalidArgument, export_pull_refused
from ..policy.stream_flow import StreamFlow
from ..registry import SubscriptionRecord
from ..storage.clock import wall
from . import convert
from .ack_journal import AckJournal
from ..delivery.history import HistorySettings
from .group_commit import GroupCommits, ack_moot
from .own_commits import OwnCommits
from .payload_cache import PayloadCache
from .publish_commit import PublishCommits
from .state import MESSAGE_OVERHEAD, RESPONSE_LIMIT, ServerState
from .status import status_of

log = logging.getLogger(__name__)

MIN_STREAM_DEADLINE = 10
MAX_STREAM_DEADLINE = 600
# Seconds a waiting stream goes without asking again: lease expiries and other processes'
# nacks make no commit to the messages table (the same bound as the library's pull waits).
IDLE_RECHECK = 1.0
# Threads for group-commit rounds (one runs per subscription at a time).
ROUND_THREADS = 8
WATCH_TIMEOUT = 1.0  # seconds the watcher thread waits per call (it checks for a stop between)
# Seconds an ack's lease must run past its deferral to be answered from the journal: room for
# its round to run late (a busy machine, commit conflicts) before the lease could end.
ACK_LEASE_MARGIN = 5.0


@dataclass(eq=False, slots=True)
class _Stream:
    subscription: str
    sub_uid: str
    topic_uid: str
    topic: str  # the topic's name, for the server's own publishes
    ordering: bool
    lease_seconds: float
    flow: StreamFlow
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    closed: bool = False  # the client half-closed its side
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # its outcome calls in flight (held until done)
    exactly_once: bool = False  # what its responses last told the client (subscription_properties)


class StreamHub:
    """The server's streams, their outstanding ack ids and their wake-ups; owns the group commit.

    Made once per server on its event loop (``hub_for``); every method runs on that loop."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        # Rounds get threads of their own: behind a queue of Publish calls on the shared pool
        # a round (and every stream and ack of its subscription) waited its turn. Measured:
        # subscribe() while the real client published 500 msg/s for 4 s, 127 of 1,996
        # messages arrived within 6 s after on the shared pool (one round took 4.1 s), 1,168
        # with this pool.
        self._rounds = ThreadPoolExecutor(max_workers=ROUND_THREADS, thread_name_prefix="deltabus-rounds")
        self.payloads = PayloadCache()  # this server's recent publishes, for the rounds that lease them
        self.own_commits = OwnCommits()  # the messages-table versions this server appended: fan-out and the watcher skip reading them
        self.activity = ActivityRecorder(state.registry, wall(state.clock))  # for expiration policies
        self.commits = GroupCommits(state.engine, self._lookup, state.clock, executor=self._rounds, cache=self.payloads,
                                    on_use=self.activity.used, own=self.own_commits, peers=self._busy,
                                    history=HistorySettings(enabled=state.settings.history),
                                    # (a local log only: the watcher reads an object store's version once a second)
                                    messages_version=None if "://" in state.engine.warehouse else self._messages_version,
                                    defer_seconds=state.settings.defer_seconds)
        # Publish appends: one thread, one append at a time for all requests queued (publish_commit).
        self._appends = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltabus-publish")
        self.publishes = PublishCommits(state.engine, state.registry, wall(state.clock), executor=self._appends, cache=self.payloads,
                                        own=self.own_commits)
        self._streams: set[_Stream] = set()
        self._owner: dict[str, _Stream] = {}
        # ack id -> the lease end its deliveries row holds once the changes queued so far commit
        # (never later than that): what an early-answered deadline change is checked against.
        self._durable: dict[str, float] = {}
        # subscription name -> how many seeks on it this hub saw (``sought``): a stream's lease
        # round that spans a change is not counted on the stream (the module docstring).
        self._seeks: dict[str, int] = {}
        self._loop = asyncio.get_running_loop()
        self._halt = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="deltabus-serve-watch", daemon=True)
        self._watcher.start()
        self._stop_task = self._loop.create_task(self._on_stop())
        self.wakeups = 0  # watcher wake-ups (a test reads it)

    # -- the subscription, outcomes ----------------------------------------------------
    def _messages_version(self) -> int:
        """The messages table's latest version (a stat of its log: ``watch.LogWatcher.current``). Any thread."""
        uri = self._state.engine.table_uri("messages")
        return self._state.watcher.current([uri])[uri]

    def _lookup(self, name: str) -> SubscriptionRecord:
        return self._state.registry.subscription(name)

    async def acknowledge(self, subscription: str, ids: Sequence[ackid.AckId], *, results: bool = False) -> list[IdResult] | None:
        """Ack through the group commit; the acked ids stop counting on their streams at once.

        `results`: a result per id (request order) when the subscription is exactly-once,
        else None (the unary Acknowledge; see the module docstring)."""
        source = self._owner.get(ackid.encode(*ids[0])) if ids else None
        if ids and await self._journaled(subscription, ids):
            return None
        for a in ids:
            self._settle(ackid.encode(*a))
        answer = await self.commits.acknowledge(subscription, ids, results_if_exactly_once=results, source=source)
        if ids:  # ordering keys: the acked messages held their keys until this commit
            self._wake(lambda s: s.ordering and s.sub_uid == ids[0].sub_uid)
        return answer

    async def _journaled(self, subscription: str, ids: Sequence[ackid.AckId]) -> bool:
        """Ack `ids` through the server's journal (``ack_journal``): answered once the journal
        holds them, committed deferred. Only when every id is leased to a stream of this
        server that is neither exactly-once (its client waits for the ack's result) nor
        ordered (a key's next message waits for the commit), with a lease that runs at least
        ACK_LEASE_MARGIN past the deferral, and the server is not stopping; False when not
        taken (the caller commits the ack before answering)."""
        journal = self._state.acks
        if journal is None or self._state.stopping.is_set():
            return False
        encoded = [ackid.encode(*a) for a in ids]
        # Its lease must outlast the deferral: an ack still queued when the lease ran out would
        # let another process lease the message again (this server's rounds hold it back).
        need = self._state.clock() + self._state.settings.defer_seconds + ACK_LEASE_MARGIN
        for enc in encoded:
            s, end = self._owner.get(enc), self._durable.get(enc)
            if s is None or s.exactly_once or s.ordering or end is None or end < need:
                return False
        written = asyncio.wrap_future(journal.record(subscription, encoded))

        def durable(f: asyncio.Future[int]) -> None:
            # Once the line is durable its ack is queued and its ids stop counting on their
            # streams, even when this call was cancelled meanwhile (else the line would stay
            # outstanding for the server's life, and the ids held their streams' room).
            if f.cancelled() or f.exception() is not None:
                return
            for enc in encoded:
                self._settle(enc)
            self._defer_ack(journal, f.result(), subscription, ids)

        written.add_done_callback(durable)
        try:
            await asyncio.shield(written)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a full disk, a journal closed by a stop: commit before answering instead
            log.warning("deltabus serve: the ack journal failed (%s); committing acks before answering", type(exc).__name__)
            return False
        return True

    def _defer_ack(self, journal: AckJournal, segment: int, subscription: str, ids: Sequence[ackid.AckId]) -> None:
        """Queue journaled acks; their line counts as committed once a round commits them, or
        when they became moot (the subscription is gone, or detached: its backlog was
        dropped). A round failing otherwise queues them again, unless the server is stopping
        (the journal keeps them for the next start)."""
        def done(fut: asyncio.Future[Any]) -> None:
            exc = None if fut.cancelled() else fut.exception()
            if fut.cancelled() or (exc is not None and not ack_moot(exc)):
                if not self._state.stopping.is_set():
                    log.warning("deltabus serve: %d journaled acks not committed (%s); queued again",
                                len(ids), "cancelled" if exc is None else type(exc).__name__)
                    self._defer_ack(journal, segment, subscription, ids)
                return
            journal.committed(segment)

        self.commits.submit_acknowledge(subscription, ids).add_done_callback(done)

    async def modify_deadline(
        self, subscription: str, ids: Sequence[ackid.AckId], seconds: float, *, results: bool = False
    ) -> list[IdResult] | None:
        """Change deadlines (0: nack) through the group commit; a nack wakes the
        subscription's streams once committed (the message is due again). `results` as
        ``acknowledge``; an id whose change did not apply no longer counts on its stream.

        A change that ends every lease no later than the end the table holds (or will hold
        once the changes queued before it commit) is answered as soon as it is queued, and
        is deferred to the subscription's next round (``GroupCommits.submit_modify_deadline``
        with `defer`): the client's receipt modack (it shortens the stream's lease
        to the client's own deadline) is such a change. Until it commits the lease only runs
        longer than the client was told, never shorter, so a crash in between cannot make a
        message come back earlier than promised. Why (measured, subscribe() at 500 msg/s):
        the Python client sends that modack as a blocking unary call BEFORE it hands the
        response's messages to the callbacks, so each delivery waited a whole round (queued
        behind the running one, then its MERGE).

        Never early for an id held by an exactly-once stream (its client waits for the
        change's result, and the early answer would confirm a lease the round has not seen)."""
        if not ids:
            return [] if results else None
        until = self._state.clock() + seconds
        early = seconds > 0
        for a in ids:
            enc = ackid.encode(*a)
            if seconds <= 0:
                self._settle(enc)
                continue
            s = self._owner.get(enc)
            end = self._durable.get(enc)
            if s is None or s.exactly_once or end is None or until > end:
                early = False
            if s is not None:
                s.flow.extended(enc, until)
        if early:
            for a in ids:
                self._durable[ackid.encode(*a)] = until
            self.commits.submit_modify_deadline(subscription, ids, seconds, defer=True).add_done_callback(_quiet)
            return None
        # What each id's durable end was when this change was queued: a change queued after it
        # (a deferred one, shorter) commits after it, so its end must not be overwritten.
        queued = {ackid.encode(*a): self._durable.get(ackid.encode(*a)) for a in ids} if seconds > 0 else {}
        answer = await self.commits.modify_deadline(subscription, ids, seconds, results_if_exactly_once=results)
        failed = {ackid.encode(*a) for a, r in zip(ids, answer or ()) if r.result is not Result.SUCCESS}
        if seconds > 0:
            for enc, was in queued.items():
                if enc in failed:  # names no current delivery: it no longer counts on its stream
                    self._settle(enc)
                elif enc in self._durable and self._durable[enc] == was:
                    self._durable[enc] = until
        else:
            self._wake(lambda s: s.sub_uid == ids[0].sub_uid)
        return answer

    def _busy(self, subscription: str) -> frozenset[object]:
        """The open streams of `subscription` with messages outstanding: their clients' acks
        are due soon (``GroupCommits``' `peers`)."""
        return frozenset(s for s in self._streams if s.subscription == subscription and s.flow.count and not s.closed)

    def _settle(self, ack_id: str) -> None:
        self._durable.pop(ack_id, None)
        s = self._owner.pop(ack_id, None)
        if s is not None and s.flow.settled(ack_id):
            s.wake.set()

    # -- seek ---------------------------------------------------------------------------------
    def seek_epoch(self, subscription: str) -> int:
        """How many seeks on `subscription` (a canonical name) this hub has seen."""
        return self._seeks.get(subscription, 0)

    def sought(self, subscription: str) -> None:
        """A seek on `subscription` (a canonical name) has committed: every ack id its streams
        hold is dead. Forget them (flow control, owners, durable ends), count the seek
        (``seek_epoch``) and wake the streams, so they lease the replayed messages now."""
        self._seeks[subscription] = self._seeks.get(subscription, 0) + 1
        for s in self._streams:
            if s.subscription != subscription:
                continue
            for a in s.flow.ack_ids():
                s.flow.settled(a)
                if self._owner.get(a) is s:
                    del self._owner[a]
                    self._durable.pop(a, None)
            s.wake.set()

    # -- wake-ups ---------------------------------------------------------------------------
    def published(self, topic: str) -> None:
        """The server committed messages to the topic named `topic`: wake its streams."""
        self._wake(lambda s: s.topic == topic)

    def _open(self, name: str) -> tuple[SubscriptionRecord, str]:
        """Blocking: the subscription's record and its topic's name ("" when the topic is gone)."""
        rec = self._lookup(name)
        topic = next((t.name for t in self._state.registry.topics().values() if t.topic_uid == rec.topic_uid), "")
        return rec, topic

    def _wake(self, which: Any = None) -> None:
        for s in self._streams:
            if which is None or which(s):
                s.wake.set()

    def _watch(self) -> None:
        """The one watcher thread: wakes every stream when the messages table moves, unless
        every new version is one this server appended (``published`` woke their topic's
        streams already). Why (measured, bench/server.py's latency phase): each of the
        server's own appends woke every stream a second time ~0-20 ms later, and a stream
        woken in the middle of its lease round asked again at once, a round that found nothing."""
        try:
            watcher = self._state.watcher
            uri = self._state.engine.table_uri("messages")
            seen = watcher.current([uri])
            while not self._halt.is_set():
                if watcher.wait_newer(seen, WATCH_TIMEOUT, self._halt):
                    now = watcher.current([uri])
                    ours = self.own_commits.own(seen[uri] + 1, now[uri])
                    seen = now
                    if not ours:
                        self.wakeups += 1
                        self._loop.call_soon_threadsafe(self._wake)
        except Exception as exc:  # the loop closed under us, or storage went away: streams still recheck
            if not self._halt.is_set():
                log.warning("deltabus serve: the log watcher thread stopped (%s)", type(exc).__name__)

    async def _on_stop(self) -> None:
        await self._state.stopping.wait()
        self._halt.set()
        self._wake()
        # Deferred changes commit now (the journaled acks above all: else the next start applies them).
        try:
            await asyncio.wait_for(self.commits.flush(), max(1.0, self._state.settings.grace_seconds))
        except Exception as exc:
            log.warning("deltabus serve: deferred acks not all committed at stop (%s); the next start applies them", type(exc).__name__)
        if self._state.acks is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._state.acks.close)
        self._rounds.shutdown(wait=False)  # queued rounds fail with UNAVAILABLE; running ones finish
        self._appends.shutdown(wait=False)  # so do queued publishes (nothing of them written: the client retries)
        _HUBS.pop(id(self._state), None)

    # -- streams ------------------------------------------------------------------------------
    def add(self, s: _Stream) -> None:
        self._streams.add(s)

    def remove(self, s: _Stream) -> None:
        self._streams.discard(s)
        for a in s.flow.ack_ids():
            if self._owner.get(a) is s:
                del self._owner[a]
                self._durable.pop(a, None)
        # Its outcome calls (acks sent on the stream just before it ended) run to their
        # commit: cancelling one still queued would drop the ack and redeliver the message.

    def own(self, s: _Stream, ack_id: str, lease_end: float) -> None:
        """`ack_id` was leased to `s` until `lease_end` (committed by its round)."""
        self._owner[ack_id] = s
        self._durable[ack_id] = lease_end

    def forget(self, s: _Stream, ack_ids: Sequence[str]) -> None:
        for a in ack_ids:
            if self._owner.get(a) is s:
                del self._owner[a]
                self._durable.pop(a, None)

    @property
    def open_streams(self) -> int:
        return len(self._streams)


_HUBS: dict[int, tuple[ServerState, StreamHub]] = {}


def hub_of(state: ServerState) -> StreamHub | None:
    """The server's StreamHub if it has one (never makes one: for tests and other threads)."""
    got = _HUBS.get(id(state))
    return got[1] if got is not None and got[0] is state else None


def hub_for(state: ServerState) -> StreamHub:
    """The server's StreamHub, made on first use; call it on the server's loop only
    (``app.start`` makes it there)."""
    got = _HUBS.get(id(state))
    if got is None or got[0] is not state:
        hub = StreamHub(state)
        _HUBS[id(state)] = (state, hub)
        return hub
    return got[1]


def decode_ids(values: Sequence[str], field_name: str) -> list[ackid.AckId]:
    return [ackid.decode(v, f"{field_name}[{i}]") for i, v in enumerate(values)]


def _deadline(seconds: int, field_name: str) -> int:
    if not MIN_STREAM_DEADLINE <= seconds <= MAX_STREAM_DEADLINE:
        raise InvalidArgument(field_name, f"must be {MIN_STREAM_DEADLINE}..{MAX_STREAM_DEADLINE} seconds, got {seconds}")
    return seconds


def _modacks(req: pb.StreamingPullRequest) -> dict[int, list[ackid.AckId]]:
    ids = list(req.modify_deadline_ack_ids)
    secs = list(req.modify_deadline_seconds)
    if len(ids) != len(secs):
        raise InvalidArgument(
            "modify_deadline_seconds", f"must have one entry per modify_deadline_ack_ids entry ({len(secs)} != {len(ids)})"
        )
    by: dict[int, list[ackid.AckId]] = {}
    for i, (a, s) in enumerate(zip(ids, secs)):
        if not 0 <= s <= MAX_STREAM_DEADLINE:
            raise InvalidArgument(f"modify_deadline_seconds[{i}]", f"must be 0..{MAX_STREAM_DEADLINE}, got {s}")
        by.setdefault(s, []).append(ackid.decode(a, f"modify_deadline_ack_ids[{i}]"))
    return by


async def _read(hub: StreamHub, s: _Stream, requests: AsyncIterator[pb.StreamingPullRequest]) -> None:
    """Consume the client's later requests: deadline, acks, deadline changes, heartbeats."""
    try:
        async for req in requests:
            if req.stream_ack_deadline_seconds:
                s.lease_seconds = _deadline(req.stream_ack_deadline_seconds, "stream_ack_deadline_seconds")
            if req.ack_ids:
                ids = decode_ids(list(req.ack_ids), "ack_ids")
                _spawn(s, hub.acknowledge(s.subscription, ids))
            if req.modify_deadline_ack_ids or req.modify_deadline_seconds:
                for secs, group in _modacks(req).items():
                    _spawn(s, hub.modify_deadline(s.subscription, group, secs))
        s.closed = True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        s.error = exc
    s.wake.set()


def _quiet(fut: asyncio.Future[Any]) -> None:
    """Done callback of an early-answered deadline change: its round's failure has nobody
    to tell (the lease then keeps its longer committed end)."""
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("an early-answered deadline change failed to commit: %s", type(fut.exception()).__name__)


def _spawn(s: _Stream, coro: Any) -> None:
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
    s.tasks.add(task)

    def done(t: asyncio.Task[None]) -> None:
        s.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            s.error = t.exception()
            s.wake.set()

    task.add_done_callback(done)


_RAW_RESPONSE = pb.StreamingPullResponse.pb()
_RAW_PROPERTIES = pb.StreamingPullResponse.SubscriptionProperties.pb()


def _responses(received: Sequence[Any], props: Any, sizes: Sequence[int]) -> list[pb.StreamingPullResponse]:
    """Responses under RESPONSE_LIMIT of the raw ReceivedMessages `received` (``convert.received_raw``),
    each with the raw SubscriptionProperties `props`, wrapped as proto-plus once each."""
    out: list[pb.StreamingPullResponse] = []
    chunk: list[Any] = []
    total = 0

    def close() -> None:
        out.append(pb.StreamingPullResponse.wrap(_RAW_RESPONSE(received_messages=chunk, subscription_properties=props)))

    for m, size in zip(received, sizes):
        if chunk and total + size > RESPONSE_LIMIT:
            close()
            chunk, total = [], 0
        chunk.append(m)
        total += size
    if chunk:
        close()
    return out


async def _abort(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, message: str) -> None:
    """End the call with `code`; a call the client already ended has nobody to tell."""
    try:
        await context.abort(code, message)
    except grpc.aio.AbortError:
        raise
    except Exception:  # the call is gone (grpc raises ExecuteBatchError writing to it)
        raise asyncio.CancelledError() from None


async def handle_streaming_pull(
    state: ServerState, request_iterator: AsyncIterator[pb.StreamingPullRequest], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[pb.StreamingPullResponse]:
    """Serve one StreamingPull call (see the module docstring)."""
    hub = hub_for(state)
    s: _Stream | None = None
    reader: asyncio.Task[None] | None = None
    try:
        try:
            first = await request_iterator.__anext__()
        except StopAsyncIteration:
            return
        if not first.subscription:
            raise InvalidArgument("subscription", "the first StreamingPull request must name the subscription")
        name = str(names.parse_subscription(first.subscription))
        lease_seconds = _deadline(first.stream_ack_deadline_seconds, "stream_ack_deadline_seconds")
        for field_name in ("max_outstanding_messages", "max_outstanding_bytes"):
            if getattr(first, field_name) < 0:
                raise InvalidArgument(field_name, f"must be >= 0 (0: no limit), got {getattr(first, field_name)}")
        flow = StreamFlow(max_messages=first.max_outstanding_messages, max_bytes=first.max_outstanding_bytes)
        rec, topic = await state.run(hub._open, name)
        if rec.push_config.is_push:
            raise FailedPrecondition(f"{rec.name} is a push subscription; pull needs an empty push endpoint")
        if rec.delta_config is not None:
            raise FailedPrecondition(export_pull_refused(rec.name))
        s = _Stream(name, rec.sub_uid, rec.topic_uid, topic, rec.enable_message_ordering, float(lease_seconds), flow)
        if first.ack_ids:  # outcomes may ride on the first request too
            _spawn(s, hub.acknowledge(name, decode_ids(list(first.ack_ids), "ack_ids")))
        for secs, group in _modacks(first).items():
            _spawn(s, hub.modify_deadline(name, group, secs))
        s.exactly_once = rec.enable_exactly_once_delivery
        hub.add(s)
        reader = asyncio.get_running_loop().create_task(_read(hub, s, request_iterator))
        while True:
            if state.stopping.is_set():
                await _abort(context, grpc.StatusCode.UNAVAILABLE, "the server is stopping; reconnect")
            if s.error is not None:
                raise s.error
            if s.closed:
                return
            now = state.clock()
            hub.forget(s, s.flow.expire(now))
            room = s.flow.room()
            s.wake.clear()
            if room > 0:
                epoch = hub.seek_epoch(name)
                granted = await hub.commits.lease(name, room, s.lease_seconds, source=s)
                if granted.messages:
                    counted = hub.seek_epoch(name) == epoch  # else a seek ran meanwhile: sent, not counted
                    s.exactly_once = granted.exactly_once  # what these responses tell the client
                    props = _RAW_PROPERTIES(message_ordering_enabled=s.ordering, exactly_once_delivery_enabled=s.exactly_once)
                    received, sizes = [], []
                    for m in granted.messages:
                        size = m.message.size
                        if counted:
                            s.flow.leased(m.ack_id, size, granted.lease_end)
                            hub.own(s, m.ack_id, granted.lease_end)
                        received.append(convert.received_raw(
                            m.ack_id, m.message.data, m.message.attributes, m.message.message_id,
                            m.message.publish_time, m.message.ordering_key, m.delivery_attempt))
                        sizes.append(size + len(m.ack_id) + len(m.message.message_id) + len(m.message.ordering_key) + MESSAGE_OVERHEAD)
                    for resp in _responses(received, props, sizes):
                        yield resp
                    if granted.more:
                        continue
                    # The round leased all there was: wait for a wake-up (one that came during
                    # the round is still set) rather than ask again at once. Why (measured,
                    # bench/server.py's latency phase): every round that leased new messages
                    # was followed by one that found nothing, holding the subscription's
                    # rounds (and the acks queued behind it) for its ~10 ms.
            try:
                await asyncio.wait_for(s.wake.wait(), IDLE_RECHECK)
            except asyncio.TimeoutError:
                pass
    except (asyncio.CancelledError, grpc.aio.AbortError):
        raise
    except Exception as exc:  # includes a request's InvalidArgument (raised by the reader)
        st = status_of(exc)
        if st.code is grpc.StatusCode.INTERNAL:
            log.error("StreamingPull failed: %s", type(exc).__name__, exc_info=exc)
        await _abort(context, st.code, st.message)
    finally:
        if reader is not None:
            reader.cancel()
        if s is not None:
            hub.remove(s)
