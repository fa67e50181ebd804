"""The core's client operations on a real Delta warehouse: one commit per call, per-id results."""

from __future__ import annotations

import time

from deltabus.delivery import operations as ops
from deltabus.delivery.model import IdResult, Result
from deltabus.registry import Registry
from deltabus.storage import open_engine
from tests.conftest import ManualClock

OK, BAD = Result.SUCCESS, Result.INVALID_ACK_ID


def test_pull_then_results_per_id(warehouse, pub, topic, subscription) -> None:
    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    a, b, c = pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}, {"data": b"c"}])

    before = engine.version("deliveries")
    leases = ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)
    assert [(l.message_id, l.delivery_attempt) for l in leases] == [(a, 1), (b, 1), (c, 1)]
    assert engine.version("deliveries") == before + 1  # fan-out, leases and cursor: one commit

    got = ops.acknowledge_results(engine, rec, [(a, 1), (b, 2), ("nope", 1)])
    assert got == [IdResult(a, 1, OK), IdResult(b, 2, BAD), IdResult("nope", 1, BAD)]
    assert ops.acknowledge_results(engine, rec, [(a, 1)]) == [IdResult(a, 1, BAD)]  # already acked

    at = engine.version("deliveries")
    assert ops.acknowledge_results(engine, rec, [("nope", 1)]) == [IdResult("nope", 1, BAD)]
    assert engine.version("deliveries") == at  # nothing applies: nothing written

    assert ops.modify_deadline_results(engine, rec, [(b, 1)], 0, clock=clock) == [IdResult(b, 1, OK)]  # nack
    assert ops.modify_deadline_results(engine, rec, [(b, 1), (c, 1)], 60, clock=clock) == [
        IdResult(b, 1, BAD),  # an extension never revives a nacked delivery
        IdResult(c, 1, OK),
    ]
    again = ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)
    assert [(l.message_id, l.delivery_attempt) for l in again] == [(b, 2)]  # c's lease was extended

    # the counting calls keep their return values
    assert ops.acknowledge(engine, rec, [(b, 1), (b, 2)]) == 1
    clock.advance(61)
    assert ops.modify_deadline(engine, rec, [(c, 1)], 30, clock=clock) == 1  # late, but nobody else has it
    assert ops.acknowledge(engine, rec, [(c, 1)]) == 1
    assert ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock) == []
