"""The streaming-pull manager speaks to the delivery core only through LeaseOps: any object
with pull, acknowledge, modify_deadline and wait_for_change drives it (no client needed)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Mapping, Sequence

import pytest

from deltabus.errors import AcknowledgeError, AcknowledgeStatus
from deltabus.subscriber.streaming_pull import EXACTLY_ONCE_MIN_LEASE, LeaseOps, StreamingPullManager
from deltabus.types import FlowControl, PubsubMessage, ReceivedMessage


class ListLeaseOps:
    """LeaseOps over a list: hands out its messages once, then waits as told."""

    def __init__(self, n: int, *, exactly_once: bool = False, invalid: Sequence[str] = ()) -> None:
        self.eod = exactly_once
        self.invalid = set(invalid)  # ack ids whose answers do not apply (their leases ran out)
        self.leases: list[int] = []
        self.plain_acks = 0
        now = dt.datetime.now(dt.timezone.utc)
        self.pending = [
            ReceivedMessage(f"ack-{i}", PubsubMessage(data=b"x", message_id=str(i), publish_time=now), 1) for i in range(n)
        ]
        self.acked: list[str] = []
        self.deadlines: list[tuple[tuple[str, ...], int]] = []
        self.waits = 0
        self.lock = threading.Lock()

    def pull(self, max_messages: int, lease_seconds: int) -> Sequence[ReceivedMessage]:
        with self.lock:
            self.leases.append(lease_seconds)
            out, self.pending = self.pending[:max_messages], self.pending[max_messages:]
        return out

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        with self.lock:
            self.plain_acks += 1
            self.acked += [a for a in ack_ids if a not in self.invalid]

    def _results(self, ack_ids: Sequence[str]) -> Mapping[str, AcknowledgeStatus]:
        return {a: AcknowledgeStatus.INVALID_ACK_ID if a in self.invalid else AcknowledgeStatus.SUCCESS for a in ack_ids}

    def acknowledge_results(self, ack_ids: Sequence[str]) -> Mapping[str, AcknowledgeStatus]:
        with self.lock:
            self.acked += [a for a in ack_ids if a not in self.invalid]
        return self._results(ack_ids)

    def modify_deadline_results(self, ack_ids: Sequence[str], seconds: int) -> Mapping[str, AcknowledgeStatus]:
        with self.lock:
            self.deadlines.append((tuple(ack_ids), seconds))
        return self._results(ack_ids)

    def exactly_once(self) -> bool:
        return self.eod

    def modify_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
        with self.lock:
            self.deadlines.append((tuple(ack_ids), seconds))

    def wait_for_change(self, timeout: float, cancel: threading.Event) -> None:
        self.waits += 1
        cancel.wait(timeout)


def test_a_stream_runs_on_any_lease_ops_and_close_ends_its_wait_at_once():
    ops = ListLeaseOps(5)
    _: LeaseOps = ops  # the type checker holds it to the protocol
    manager = StreamingPullManager(ops, "projects/p/subscriptions/s", lambda m: m.ack(), FlowControl(max_messages=10))
    manager.start()
    end = time.monotonic() + 5
    while len(ops.acked) < 5 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.1)  # the consumer is now waiting for a change (up to 1 s)
    assert ops.waits >= 1
    t0 = time.monotonic()
    manager.close()
    assert time.monotonic() - t0 < 0.5  # the wait ended with the stop event, not its timeout
    assert sorted(ops.acked) == [f"ack-{i}" for i in range(5)]
    assert all(seconds != 0 for _, seconds in ops.deadlines)  # all acked: nothing left to nack


def _run(ops: ListLeaseOps, callback, n: int, **kw) -> StreamingPullManager:  # type: ignore[no-untyped-def]
    manager = StreamingPullManager(ops, "projects/p/subscriptions/s", callback, FlowControl(max_messages=10, **kw))
    manager.start()
    return manager


def _futures_of(ops: ListLeaseOps, n: int, answer: str) -> dict[str, object]:
    got: dict[str, object] = {}
    done = threading.Event()

    def callback(m) -> None:  # type: ignore[no-untyped-def]
        future = m.ack_with_response() if answer == "ack" else m.nack_with_response()
        try:
            got[m.ack_id] = future.result(timeout=5)
        except AcknowledgeError as exc:
            got[m.ack_id] = exc
        if len(got) == n:
            done.set()

    manager = _run(ops, callback, n)
    assert done.wait(10)
    manager.close()
    return got


def test_with_exactly_once_each_response_says_whether_its_answer_applied():
    ops = ListLeaseOps(4, exactly_once=True, invalid=["ack-1", "ack-3"])
    got = _futures_of(ops, 4, "ack")
    assert got["ack-0"] is AcknowledgeStatus.SUCCESS and got["ack-2"] is AcknowledgeStatus.SUCCESS
    for a in ("ack-1", "ack-3"):
        assert isinstance(got[a], AcknowledgeError) and got[a].error_code is AcknowledgeStatus.INVALID_ACK_ID
    assert ops.plain_acks == 0 and sorted(ops.acked) == ["ack-0", "ack-2"]
    assert all(lease >= EXACTLY_ONCE_MIN_LEASE for lease in ops.leases)
    nacked = _futures_of(ListLeaseOps(2, exactly_once=True, invalid=["ack-0"]), 2, "nack")
    assert isinstance(nacked["ack-0"], AcknowledgeError) and nacked["ack-1"] is AcknowledgeStatus.SUCCESS


def test_without_exactly_once_a_response_is_success_once_sent():
    ops = ListLeaseOps(3, invalid=["ack-1"])
    got = _futures_of(ops, 3, "ack")
    assert all(v is AcknowledgeStatus.SUCCESS for v in got.values())  # best effort, as google-cloud-pubsub
    assert ops.plain_acks >= 1
    assert all(lease < EXACTLY_ONCE_MIN_LEASE for lease in ops.leases)


def test_with_exactly_once_a_lease_that_does_not_extend_is_let_go():
    ops = ListLeaseOps(2, exactly_once=True, invalid=["ack-0"])
    release = threading.Event()
    held: list[object] = []

    def callback(m) -> None:  # type: ignore[no-untyped-def]
        held.append(m)
        release.wait(10)

    manager = _run(ops, callback, 2)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with manager._lock:
            if len(held) == 2 and list(manager._held) == ["ack-1"]:
                break
        time.sleep(0.02)
    with manager._lock:
        assert list(manager._held) == ["ack-1"]  # ack-0's extension failed: no longer held or extended
    release.set()
    with pytest.raises(AcknowledgeError):
        held[0].ack_with_response().result(timeout=5)  # type: ignore[attr-defined]
    manager.close()


def test_with_exactly_once_a_future_fails_when_the_setting_cannot_be_read():
    """The sender asks whether the subscription has exactly-once delivery per batch; when
    that read fails, its futures fail (OTHER), never a SUCCESS for an ack that did not apply."""

    class Flaky(ListLeaseOps):
        def __init__(self) -> None:
            super().__init__(1, exactly_once=True)
            self.calls = 0

        def exactly_once(self) -> bool:
            self.calls += 1
            if self.calls > 2:  # the consumer's and the leaser's first reads work; then the store fails
                raise OSError("object store timed out")
            return True

        def acknowledge(self, ack_ids: Sequence[str]) -> None:
            raise OSError("object store timed out")

    got = _futures_of(Flaky(), 1, "ack")
    (only,) = got.values()
    assert isinstance(only, AcknowledgeError) and only.error_code is AcknowledgeStatus.OTHER


def test_an_uncertain_clock_is_retried_not_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    """ClockUncertain from a pull or an extension (a lease refused while the storage's time
    is known too loosely) is waited out: the stream keeps its messages and goes on."""
    from deltabus.errors import ClockUncertain
    from deltabus.subscriber import streaming_pull

    monkeypatch.setattr(streaming_pull, "CLOCK_RETRY_SECONDS", 0.01, raising=False)
    monkeypatch.setattr(streaming_pull.lease_policy, "next_pass_delay", lambda deadline, rand: 0.05)  # extend often

    class Uncertain(ListLeaseOps):
        def __init__(self) -> None:
            super().__init__(3)
            self.refusals = {"pull": 2, "extend": 2}

        def _refuse(self, what: str) -> None:
            with self.lock:
                if self.refusals[what] > 0:
                    self.refusals[what] -= 1
                    raise ClockUncertain("lease refused: known only to ±3 s")

        def pull(self, max_messages: int, lease_seconds: int) -> Sequence[ReceivedMessage]:
            self._refuse("pull")
            return super().pull(max_messages, lease_seconds)

        def modify_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
            if seconds > 0:
                self._refuse("extend")
            super().modify_deadline(ack_ids, seconds)

    ops = Uncertain()
    release = threading.Event()
    manager = _run(ops, lambda m: (release.wait(5), m.ack()), 3)
    end = time.monotonic() + 5
    while (ops.refusals["extend"] or not ops.deadlines) and time.monotonic() < end:
        time.sleep(0.01)
    assert ops.refusals == {"pull": 0, "extend": 0} and not manager.future.done()
    release.set()
    while len(ops.acked) < 3 and time.monotonic() < end:
        time.sleep(0.01)
    assert sorted(ops.acked) == ["ack-0", "ack-1", "ack-2"] and not manager.future.done()
    manager.close()
