"""Streaming pull: pull under flow control, run callbacks, batch acks, extend leases.

Three threads per stream, as python-pubsub's streaming pull manager:
- the consumer pulls while flow control has room and hands messages to the callback pool;
- the dispatcher sends acks, nacks and deadline changes in batches (one MERGE each);
- the leaser extends the deadline of everything still held, sized by the 99th
  percentile of observed ack delay, until max_lease_duration.

The manager talks to the delivery core through ``LeaseOps`` (pull, acknowledge, change
deadlines, wait for a change), not to the client that made it. When a pull finds nothing the
consumer waits for a change (the process's log watcher) instead of sleep-polling.
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import random
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from concurrent.futures import Future
from typing import Callable, Literal, Mapping, NamedTuple, Protocol, Sequence

from ..errors import AcknowledgeError, AcknowledgeStatus, ClockUncertain, FailedPrecondition, NotFound
from ..policy import flow_control as fc
from ..policy import leases as lease_policy
from ..policy.histogram import Histogram
from ..policy.redelivery import after_callback_error
from ..types import FlowControl, ReceivedMessage
from .futures import StreamingPullFuture
from .message import Message

log = logging.getLogger(__name__)

_BATCH_WAIT = 0.05
_MAX_BATCH = 2500
_IDLE_WAIT = 1.0  # the longest wait for a change after an empty pull (LeaseOps may wait less)
# Seconds before a lease or extension refused for an uncertain clock (ClockUncertain) is asked again.
CLOCK_RETRY_SECONDS = 1.0

# What a callback asks of the dispatcher; "stop" (no message) ends it after the batch it is in.
RequestKind = Literal["ack", "nack", "modack", "stop"]


class _Request(NamedTuple):
    kind: RequestKind
    ack_id: str  # "" for "stop"
    seconds: int  # the new deadline of a "modack"; 0 otherwise
    future: "Future[AcknowledgeStatus] | None" = None  # a *_with_response call's


# With exactly-once delivery a lease is never shorter than this (seconds), as
# google-cloud-pubsub's client: fewer leases run out under a slow callback, and each that
# does makes its ack fail.
EXACTLY_ONCE_MIN_LEASE = 60


class LeaseOps(Protocol):
    """What a stream needs of the delivery core, for its one subscription.

    ``pull`` and ``wait_for_change`` are called from the consumer thread only; acknowledge
    and modify_deadline from the dispatcher and leaser threads. Errors propagate (NotFound
    once the subscription is deleted)."""

    def pull(self, max_messages: int, lease_seconds: int) -> Sequence[ReceivedMessage]:
        """Lease up to `max_messages` messages for `lease_seconds`; [] when none is due."""
        ...

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        """Ack; ids that expired, were superseded or are unknown are ignored."""
        ...

    def modify_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
        """Set the leases' deadline to now + `seconds` (0: nack)."""
        ...

    def acknowledge_results(self, ack_ids: Sequence[str]) -> Mapping[str, AcknowledgeStatus]:
        """Ack, and say for each ack id whether this applied it (exactly-once delivery)."""
        ...

    def modify_deadline_results(self, ack_ids: Sequence[str], seconds: int) -> Mapping[str, AcknowledgeStatus]:
        """``modify_deadline``, saying for each ack id whether this applied it."""
        ...

    def exactly_once(self) -> bool:
        """Whether the subscription has exactly-once delivery now (asked per batch: an update
        while the stream runs counts)."""
        ...

    def wait_for_change(self, timeout: float, cancel: threading.Event) -> None:
        """After an empty ``pull``: return when something may be due (a new commit), after at
        most `timeout` seconds, or soon after `cancel` is set."""
        ...



@dataclass(slots=True)
class _Held:
    size: int
    leased_at: float  # wall clock, for max_lease_duration
    dispatched: bool
    ordering_key: str = ""


class StreamingPullManager:
    def __init__(
        self,
        ops: LeaseOps,
        subscription: str,
        callback: Callable[[Message], object],
        flow_control: FlowControl,
        *,
        executor: Executor | None = None,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        await_callbacks_on_shutdown: bool = False,
        has_retry_policy: Callable[[], bool] = lambda: False,
    ) -> None:
        self._ops = ops
        self._has_retry_policy = has_retry_policy
        self._subscription = subscription
        self._callback = callback
        self._flow = flow_control
        self._own_executor = executor is None
        self._await_callbacks = await_callbacks_on_shutdown
        self._executor = executor or ThreadPoolExecutor(max_workers=10, thread_name_prefix="deltabus-callback")
        self._clock = clock
        self._rand = rand

        self._lock = threading.Condition()
        self._held: dict[str, _Held] = {}
        self._on_hold: collections.deque[Message] = collections.deque()
        # Ordering keys (issue 13, as Pub/Sub's client): one message per key in the callbacks
        # at a time, in order; key -> the ack id being processed.
        self._busy_keys: dict[str, str] = {}
        self._dispatched_count = 0
        self._dispatched_bytes = 0
        self._leased_bytes = 0
        self._paused = False
        self._histogram = Histogram()
        self._requests: "queue.Queue[_Request]" = queue.Queue()
        self._stop = threading.Event()
        self._closed = threading.Event()
        # Orders a callback's request against close(): a request either enters the queue
        # before the dispatcher's stop sentinel, or is sent directly once closing began.
        self._submit_lock = threading.Lock()
        self._closing = False
        self._close_lock = threading.Lock()
        self._clock_warned = False
        self.future = StreamingPullFuture(self.close)
        self._threads = [
            threading.Thread(target=self._guard(self._consume), name="deltabus-consumer", daemon=True),
            threading.Thread(target=self._guard(self._lease), name="deltabus-leaser", daemon=True),
        ]
        self._dispatcher = threading.Thread(target=self._guard(self._dispatch_requests), name="deltabus-dispatcher", daemon=True)

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> StreamingPullFuture:
        for t in self._threads:
            t.start()
        self._dispatcher.start()
        return self.future

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # the stream is broken: surface it on the future
                log.error("streaming pull on %s failed: %s", self._subscription, exc)
                self.future.resolve_with_stream_error(exc)
                threading.Thread(target=self.close, daemon=True).start()

        return run

    def close(self) -> None:
        """Stop pulling and extending; nack everything still held; flush pending requests."""
        with self._close_lock:
            if self._closed.is_set():
                return
            self._stop.set()
            with self._lock:
                self._lock.notify_all()
            for t in self._threads:
                if t is not threading.current_thread() and t.is_alive():
                    t.join()
            if self._own_executor:  # callbacks not yet started are dropped; their messages are nacked below
                self._executor.shutdown(wait=self._await_callbacks, cancel_futures=True)
            with self._lock:
                held = list(self._held)
                self._held.clear()
                self._on_hold.clear()
                self._leased_bytes = self._dispatched_bytes = self._dispatched_count = 0
            with self._submit_lock:
                self._closing = True
                for ack_id in held:
                    self._requests.put(_Request("nack", ack_id, 0))
                self._requests.put(_Request("stop", "", 0))
            if self._dispatcher is not threading.current_thread() and self._dispatcher.is_alive():
                self._dispatcher.join()
            self._closed.set()
            self.future.resolve_closed()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # -- flow control and dispatch --------------------------------------------
    def _release(self, ack_id: str) -> None:
        with self._lock:
            h = self._held.pop(ack_id, None)
            if h is None:
                return
            self._leased_bytes -= h.size
            if h.ordering_key and self._busy_keys.get(h.ordering_key) == ack_id:
                del self._busy_keys[h.ordering_key]
            if h.dispatched:
                self._dispatched_count -= 1
                self._dispatched_bytes -= h.size
            self._lock.notify_all()
        self._dispatch_on_hold()

    def _dispatch_on_hold(self) -> None:
        ready: list[Message] = []
        with self._lock:
            waiting: collections.deque[Message] = collections.deque()  # keyed messages behind a busy key, in order
            blocked: set[str] = set()
            while self._on_hold:
                key = self._on_hold[0].ordering_key
                if key and (key in self._busy_keys or key in blocked):
                    waiting.append(self._on_hold.popleft())
                    blocked.add(key)
                    continue
                if not fc.may_dispatch(self._dispatched_count, self._dispatched_bytes, self._on_hold[0].size, self._flow):
                    break
                m = self._on_hold.popleft()
                h = self._held.get(m.ack_id)
                if h is None:  # released (e.g. max lease duration) while on hold
                    continue
                if key:
                    self._busy_keys[key] = m.ack_id
                h.dispatched = True
                self._dispatched_count += 1
                self._dispatched_bytes += m.size
                ready.append(m)
            if waiting:
                waiting.extend(self._on_hold)
                self._on_hold = waiting
        for m in ready:
            try:
                self._executor.submit(self._run_callback, m)
            except RuntimeError:  # executor shut down: we are closing
                return

    def _run_callback(self, message: Message) -> None:
        try:
            self._callback(message)
        except Exception as exc:
            self._on_callback_error(message, exc)

    def _on_callback_error(self, message: Message, exc: Exception) -> None:
        """Give the message back after a growing delay, log one line, resolve the future.

        As google-cloud-pubsub (``_wrap_callback_errors`` with ``on_callback_error=
        future.set_exception``): the first callback error resolves the future with that
        exception while the stream keeps running; ``cancel()`` stops it. When the
        subscription has a retry policy (``has_retry_policy``, asked at the error) the
        message is nacked, as Pub/Sub's client does, and the policy's delay applies; the
        stream's own growing delay (``policy.redelivery``) is only for subscriptions
        without one, which Pub/Sub itself would redeliver at once.
        """
        policy = self._has_retry_policy()
        delay = 0 if policy else after_callback_error(message.delivery_attempt, self._rand())
        with self._lock:
            still_held = message.ack_id in self._held
        if still_held:  # the callback did not ack or nack before raising
            self._drop_followers(message)
            if policy:
                self._submit("nack", message)
            else:
                self._submit("modack", message, delay)
            self._release(message.ack_id)
        # One line, no payload; the exception's own text is cut to one line and 200 chars.
        text = " ".join(str(exc).split())
        log.error(
            "callback raised on %s for message %s (delivery attempt %d): %s: %s; %s",
            self._subscription, message.message_id, message.delivery_attempt, type(exc).__name__,
            text[:200] + ("..." if len(text) > 200 else ""),
            ("nacked: the retry policy delays it" if policy else f"redelivering in {delay}s")
            if still_held else "it had acked or nacked the message already",
        )
        log.debug("traceback of the callback error for message %s on %s", message.message_id, self._subscription, exc_info=exc)
        self.future.resolve_with_callback_error(exc)

    # -- the three loops ----------------------------------------------------------
    def _consume(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._paused = fc.next_paused(self._paused, len(self._held), self._leased_bytes, self._flow)
                room = fc.room(len(self._held), self._flow)
                if self._paused or room == 0:
                    self._lock.wait(0.1)
                    continue
            deadline = self._lease_seconds(self._ops.exactly_once())
            try:
                received = self._ops.pull(min(room, 1000), deadline)
            except NotFound:
                raise
            except ClockUncertain as exc:  # retryable: the clock is re-read (and the storage probed) next time
                self._clock_refused(exc)
                continue
            now = self._clock()
            if not received:
                self._ops.wait_for_change(_IDLE_WAIT, self._stop)
                continue
            messages = [Message(r, self, now) for r in received]
            with self._lock:
                for m in messages:
                    self._held[m.ack_id] = _Held(m.size, now, False, m.ordering_key)
                    self._leased_bytes += m.size
                    self._on_hold.append(m)
            self._dispatch_on_hold()

    def _lease_seconds(self, exactly_once: bool = False) -> int:
        with self._lock:
            p99 = self._histogram.percentile(99)
        seconds = lease_policy.extension_seconds(p99, self._flow)
        return max(seconds, EXACTLY_ONCE_MIN_LEASE) if exactly_once else seconds

    def _lease(self) -> None:
        while not self._stop.is_set():
            exactly_once = self._ops.exactly_once()
            deadline = self._lease_seconds(exactly_once)
            now = self._clock()
            with self._lock:
                expired = lease_policy.over_max_lease(
                    {k: h.leased_at for k, h in self._held.items()}, now, self._flow.max_lease_duration
                )
            for ack_id in expired:
                log.warning("dropping lease after max_lease_duration (%ss) on %s", self._flow.max_lease_duration, self._subscription)
                self._release(ack_id)
            with self._lock:
                ack_ids = list(self._held)
            try:
                self._extend(ack_ids, exactly_once, deadline)
            except ClockUncertain as exc:  # retryable: extend again soon, the held messages are kept
                self._clock_refused(exc)
                continue
            self._stop.wait(lease_policy.next_pass_delay(deadline, self._rand()))

    def _clock_refused(self, exc: ClockUncertain) -> None:
        """A lease or extension refused for a clock known too loosely (``ClockUncertain``):
        logged once per stream, then retried after CLOCK_RETRY_SECONDS (never fatal)."""
        with self._lock:
            first, self._clock_warned = not self._clock_warned, True
        if first:
            log.warning("streaming pull on %s: %s; retrying every %g s", self._subscription, exc, CLOCK_RETRY_SECONDS)
        self._stop.wait(CLOCK_RETRY_SECONDS)

    def _extend(self, ack_ids: list[str], exactly_once: bool, deadline: int) -> None:
        if ack_ids and exactly_once:
            # Extended only with confirmation: a lease that did not extend (it ran out and
            # the message went to another delivery) is let go; its ack would fail.
            results = self._ops.modify_deadline_results(ack_ids, deadline)
            lost = [a for a in ack_ids if results.get(a) is not AcknowledgeStatus.SUCCESS]
            if lost:
                log.info("%d leases on %s could not be extended (delivered again elsewhere); letting them go",
                         len(lost), self._subscription)
            for ack_id in lost:
                self._release(ack_id)
        elif ack_ids:
            self._ops.modify_deadline(ack_ids, deadline)

    def _dispatch_requests(self) -> None:
        stopping = False
        while not stopping:
            try:
                first = self._requests.get(timeout=0.5)
            except queue.Empty:
                continue
            batch = [first]
            end = time.monotonic() + _BATCH_WAIT
            while len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._requests.get(timeout=max(0.0, end - time.monotonic())))
                except queue.Empty:
                    break
            stopping = any(r.kind == "stop" for r in batch)
            self._send([r for r in batch if r.kind != "stop"])

    def _send(self, batch: Sequence[_Request]) -> None:
        """Send a batch of answers: acks in one call, nacks in one, deadline changes one call
        per deadline. Futures (the ``*_with_response`` calls) are resolved: with exactly-once
        delivery by each ack id's own result, else with SUCCESS once sent (as
        google-cloud-pubsub: without exactly-once an answer is best effort)."""
        acks = [r.ack_id for r in batch if r.kind == "ack"]
        nacks = [r.ack_id for r in batch if r.kind == "nack"]
        modacks: dict[int, list[str]] = {}
        for r in batch:
            if r.kind == "modack":
                modacks.setdefault(r.seconds, []).append(r.ack_id)
        futures = [r for r in batch if r.future is not None]
        try:
            exactly_once = bool(futures) and self._ops.exactly_once()
        except Exception as exc:  # unknown whether these answers must be confirmed: never say SUCCESS
            self._send_best_effort(acks, nacks, modacks)
            code = AcknowledgeStatus.FAILED_PRECONDITION if isinstance(exc, FailedPrecondition) else AcknowledgeStatus.OTHER
            for r in futures:
                _fail(r.future, AcknowledgeError(code, f"could not read the subscription: {exc}"))
            return
        if exactly_once:
            self._send_with_results(batch, acks, nacks, modacks)
            return
        self._send_best_effort(acks, nacks, modacks)
        for r in futures:
            _resolve(r.future, AcknowledgeStatus.SUCCESS)

    def _send_with_results(self, batch: Sequence[_Request], acks: list[str], nacks: list[str], modacks: dict[int, list[str]]) -> None:
        outcome: dict[tuple[str, str], AcknowledgeStatus | BaseException] = {}
        calls: list[tuple[str, list[str], Callable[[], Mapping[str, AcknowledgeStatus]]]] = []
        if acks:
            calls.append(("ack", acks, lambda: self._ops.acknowledge_results(acks)))
        if nacks:
            calls.append(("nack", nacks, lambda: self._ops.modify_deadline_results(nacks, 0)))
        for seconds, ids in modacks.items():
            calls.append(("modack", ids, functools.partial(self._ops.modify_deadline_results, ids, seconds)))
        for kind, ids, call in calls:
            try:
                results = call()
                for a in ids:
                    outcome[(kind, a)] = results.get(a, AcknowledgeStatus.INVALID_ACK_ID)
            except Exception as exc:
                log.error("sending %d %ss for %s failed: %s", len(ids), kind, self._subscription, exc)
                for a in ids:
                    outcome[(kind, a)] = exc
        for r in batch:
            if r.future is None:
                continue
            got = outcome.get((r.kind, r.ack_id), AcknowledgeStatus.OTHER)
            if isinstance(got, BaseException):
                code = AcknowledgeStatus.FAILED_PRECONDITION if isinstance(got, FailedPrecondition) else AcknowledgeStatus.OTHER
                _fail(r.future, AcknowledgeError(code, str(got)))
            elif got is AcknowledgeStatus.SUCCESS:
                _resolve(r.future, got)
            else:
                _fail(r.future, AcknowledgeError(got))

    def _send_best_effort(self, acks: list[str], nacks: list[str], modacks: dict[int, list[str]]) -> None:
        try:
            if acks:
                self._ops.acknowledge(acks)
            if nacks:
                self._ops.modify_deadline(nacks, 0)
            for seconds, ids in modacks.items():
                self._ops.modify_deadline(ids, seconds)
        except NotFound:
            log.warning("subscription %s was deleted; dropping %d requests", self._subscription, len(acks) + len(nacks))
        except Exception as exc:  # keep dispatching: these messages are redelivered after their deadline
            log.error(
                "sending %d acks, %d nacks, %d deadline changes for %s failed: %s",
                len(acks), len(nacks), sum(len(v) for v in modacks.values()), self._subscription, exc,
            )

    # -- RequestSink: called from callbacks ----------------------------------------
    def _submit(self, kind: RequestKind, message: Message, seconds: int = 0, future: "Future[AcknowledgeStatus] | None" = None) -> None:
        request = _Request(kind, message.ack_id, seconds, future)
        with self._submit_lock:
            if not self._closing:
                self._requests.put(request)
                return
        # The stream is closing or closed; carry the request out directly rather than lose it.
        self._send([request])

    def ack(self, message: Message, future: "Future[AcknowledgeStatus] | None" = None) -> None:
        with self._lock:
            self._histogram.add(self._clock() - message.received_at)
        self._submit("ack", message, 0, future)
        self._release(message.ack_id)

    def nack(self, message: Message, future: "Future[AcknowledgeStatus] | None" = None) -> None:
        self._drop_followers(message)
        self._submit("nack", message, 0, future)
        self._release(message.ack_id)

    def _drop_followers(self, message: Message) -> None:
        """Ordering keys: a nacked (or failed) message comes again before what followed it,
        so the held messages of its key not yet given to the callback are let go unanswered
        (a nack ends their leases in the core; after a failed callback's delayed redelivery
        their leases run out), and are redelivered after it."""
        key = message.ordering_key
        if not key:
            return
        with self._lock:
            keep: collections.deque[Message] = collections.deque()
            for m in self._on_hold:
                if m.ordering_key != key:
                    keep.append(m)
                    continue
                h = self._held.pop(m.ack_id, None)
                if h is not None:
                    self._leased_bytes -= h.size
            self._on_hold = keep
            self._lock.notify_all()

    def modify_ack_deadline(self, message: Message, seconds: int, future: "Future[AcknowledgeStatus] | None" = None) -> None:
        if seconds == 0:
            self.nack(message, future)
        else:
            self._submit("modack", message, seconds, future)


def _resolve(future: "Future[AcknowledgeStatus] | None", status: AcknowledgeStatus) -> None:
    if future is not None and not future.done():
        future.set_result(status)


def _fail(future: "Future[AcknowledgeStatus] | None", exc: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(exc)
