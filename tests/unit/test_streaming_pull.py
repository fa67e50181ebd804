"""The streaming-pull manager speaks to the delivery core only through LeaseOps: any object
with pull, acknowledge, modify_deadline and wait_for_change drives it (no client needed)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Sequence

from deltabus.subscriber.streaming_pull import LeaseOps, StreamingPullManager
from deltabus.types import FlowControl, PubsubMessage, ReceivedMessage


class ListLeaseOps:
    """LeaseOps over a list: hands out its messages once, then waits as told."""

    def __init__(self, n: int) -> None:
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
            out, self.pending = self.pending[:max_messages], self.pending[max_messages:]
        return out

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        with self.lock:
            self.acked += ack_ids

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
