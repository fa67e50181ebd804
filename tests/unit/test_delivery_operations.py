"""The core's client operations on a real Delta warehouse: one commit per call, per-id results."""

from __future__ import annotations

import time

import pytest

from deltabus.delivery import operations as ops
from deltabus.delivery.history import OFF
from deltabus.delivery.merge import commit
from deltabus.delivery.model import IdResult, OutcomeKind, Result
from deltabus.delivery.outcomes import latest_per_message, rows
from deltabus.delivery.selection import read_available
from deltabus.registry import Registry
from deltabus.storage import open_engine
from deltabus.storage.tables import DELIVERIES
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
    assert ops.acknowledge_results(engine, rec, [("nope", 1)], history=OFF) == [IdResult("nope", 1, BAD)]
    assert engine.version("deliveries") == at  # nothing applies: nothing written (without history)
    assert ops.acknowledge_results(engine, rec, [("nope", 1)]) == [IdResult("nope", 1, BAD)]
    assert engine.version("deliveries") == at  # nor with it: an id naming no message is not history (Pub/Sub ignores it)

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


def test_read_available_leaves_out_excluded_ids_and_still_fills_the_limit(warehouse, pub, topic, subscription) -> None:
    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    a, b, c = pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}, {"data": b"c"}])
    assert len(ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)) == 3
    clock.advance(11)  # every lease ran out: all three are available again
    snap = engine.snapshot(DELIVERIES.name)

    def ids(limit: int, exclude: frozenset[str]) -> list[str]:
        return read_available(snap, rec.sub_uid, clock(), limit, exclude)["message_id"].to_pylist()

    assert ids(10, frozenset()) == [a, b, c]
    assert ids(10, frozenset({b})) == [a, c]
    assert ids(1, frozenset({a})) == [b]  # excluded ids do not use up the limit
    assert ids(0, frozenset()) == []


def test_counted_extension_never_revives_a_nacked_row(warehouse, pub, topic, subscription) -> None:
    # The counting call writes without reading first, so only the MERGE's DEADLINE clause
    # (its nacked guard) keeps the extension off the nacked row.
    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    (a,) = pub.publish_batch(topic, [{"data": b"a"}])
    assert [l.message_id for l in ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)] == [a]
    assert ops.modify_deadline(engine, rec, [(a, 1)], 0, clock=clock) == 1  # nack
    assert ops.modify_deadline(engine, rec, [(a, 1)], 60, clock=clock) == 0
    again = ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)
    assert [(l.message_id, l.delivery_attempt) for l in again] == [(a, 2)]


def test_commit_refuses_rows_for_a_subscription_it_is_not_pinned_to(warehouse, pub, topic, subscription) -> None:
    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    (a,) = pub.publish_batch(topic, [{"data": b"a"}])
    assert len(ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)) == 1
    stray = rows("another-sub", OutcomeKind.ACK, latest_per_message([(a, 1)]))  # same message id, other sub
    before = engine.version(DELIVERIES.name)
    with pytest.raises(ValueError, match="sub_uid"):
        commit(engine.snapshot(DELIVERIES.name), [stray], [rec.sub_uid])
    assert engine.version(DELIVERIES.name) == before  # nothing written
    assert ops.acknowledge(engine, rec, [(a, 1)]) == 1  # this subscription's row is still there
