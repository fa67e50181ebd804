"""server.group_commit.run_round on real Delta tables: many callers of one subscription, ONE
commit; one outcome per message (ack wins, else the last deadline change); ids with an
outcome are not leased in the same round; per-caller lease lengths; per-id results."""

from __future__ import annotations

import pyarrow.compute as pc

from deltabus import ackid
from deltabus.delivery.model import Result
from deltabus.registry import Registry
from deltabus.server.group_commit import Granted, LeaseAsk, OutcomeAsk, run_round
from deltabus.storage import open_engine
from deltabus.timestamps import to_us
from tests.conftest import ManualClock


def _setup(warehouse: str, clock: ManualClock, subscription: str):
    engine = open_engine(warehouse, engine="delta-rs")
    return engine, Registry(engine, clock=clock).subscription(subscription)


def _ids(granted) -> list[ackid.AckId]:
    assert isinstance(granted, Granted)
    return [ackid.decode(m.ack_id) for m in granted.messages]


def test_two_lease_callers_share_one_commit(pub, sub, topic, subscription, warehouse, clock) -> None:
    published = pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(5)])
    engine, rec = _setup(warehouse, clock, subscription)
    before = engine.version("deliveries")
    a, b = run_round(engine, rec, [LeaseAsk(3, 10.0), LeaseAsk(5, 10.0)], clock)
    assert engine.version("deliveries") == before + 1  # fan-out, both callers' leases: one MERGE
    got_a, got_b = _ids(a), _ids(b)
    assert len(got_a) == 3 and len(got_b) == 2
    assert [i.message_id for i in got_a + got_b] == published  # arrival order, publish order
    assert a.messages[0].message.data == b"0" and a.lease_end == clock() + 10.0


def test_outcomes_of_one_message_resolve_to_one_row(pub, sub, topic, subscription, warehouse, clock) -> None:
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(4)])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(3, 10.0)], clock)
    x, y, z = _ids(first)
    before = engine.version("deliveries")
    other = ackid.AckId("someothersub", y.message_id, y.delivery_attempt)
    answers = run_round(engine, rec, [
        OutcomeAsk((x,), None, True),  # ack x ...
        OutcomeAsk((x,), 30.0, True),  # ... and extend it: the ack wins
        OutcomeAsk((y,), 0.0, True),  # nack y, then extend it: the last deadline change wins
        OutcomeAsk((y, other), 60.0, True),
        OutcomeAsk((z,), 0.0, True),  # nack z
        LeaseAsk(10, 10.0),  # z has an outcome in this round: not leased again in it
    ], clock)
    assert engine.version("deliveries") == before + 1
    assert answers[0] == [(x.message_id, x.delivery_attempt, Result.SUCCESS)]
    assert answers[1] == [(x.message_id, x.delivery_attempt, Result.SUCCESS)]
    assert [r.result for r in answers[3]] == [Result.SUCCESS, Result.INVALID_ACK_ID]
    assert [r.result for r in answers[4]] == [Result.SUCCESS]
    leased = _ids(answers[5])
    assert [i.message_id for i in leased] != [] and z.message_id not in {i.message_id for i in leased}
    assert len(leased) == 1  # only the 4th message (never delivered) was due
    rows = engine.snapshot("deliveries").read(["message_id", "lease_expires"], partition=rec.sub_uid)
    lease = dict(zip(rows["message_id"].to_pylist(), pc.cast(rows["lease_expires"], "int64").to_pylist()))
    assert x.message_id not in lease  # acked
    assert lease[y.message_id] == to_us(clock() + 60.0)  # extended, not nacked
    assert lease[z.message_id] <= 1  # nacked
    clock.advance(11.0)  # the 4th message's 10 s lease ran out; y's 60 s did not
    (again,) = run_round(engine, rec, [LeaseAsk(10, 10.0)], clock)
    got = {i.message_id: i.delivery_attempt for i in _ids(again)}
    assert z.message_id in got and got[z.message_id] == 2 and y.message_id not in got and len(got) == 2


def test_each_caller_gets_its_own_lease_length(pub, sub, topic, subscription, warehouse, clock) -> None:
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(4)])
    engine, rec = _setup(warehouse, clock, subscription)
    short, long_ = run_round(engine, rec, [LeaseAsk(2, 10.0), LeaseAsk(2, 100.0)], clock)
    assert short.lease_end == clock() + 10.0 and long_.lease_end == clock() + 100.0
    clock.advance(11.0)
    (again,) = run_round(engine, rec, [LeaseAsk(10, 10.0)], clock)
    assert sorted(i.message_id for i in _ids(again)) == sorted(i.message_id for i in _ids(short))


def test_an_outcome_only_round_reads_nothing_without_results(pub, sub, topic, subscription, warehouse, clock) -> None:
    pub.publish_batch(topic, [{"data": b"a"}])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(1, 10.0)], clock)
    (x,) = _ids(first)
    assert run_round(engine, rec, [OutcomeAsk((x,), None)], clock) == [None]
    assert engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid).num_rows == 0
    before = engine.version("deliveries")
    assert run_round(engine, rec, [LeaseAsk(5, 10.0)], clock)[0].messages == []
    assert engine.version("deliveries") == before  # nothing to lease: nothing written


def test_ordering_keys_stay_on_one_caller_and_a_nack_cascades_over_an_extension(pub, sub, topic, warehouse, clock) -> None:
    name = sub.subscription_path("local", "ordered")
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True})
    pub.publish_batch(topic, [{"data": f"{i}".encode(), "ordering_key": f"k{i % 2}"} for i in range(6)])
    engine, rec = _setup(warehouse, clock, name)
    a, b = run_round(engine, rec, [LeaseAsk(1, 10.0), LeaseAsk(10, 10.0)], clock)
    by_key: dict[str, set[int]] = {}
    for caller, granted in enumerate((a, b)):
        for m in granted.messages:
            by_key.setdefault(m.message.ordering_key, set()).add(caller)
        datas = [int(m.message.data) for m in granted.messages]
        assert datas == sorted(datas)  # lease order is publish order within a caller
    assert all(len(callers) == 1 for callers in by_key.values())  # a key's leases on one caller
    k0 = [ackid.decode(m.ack_id) for m in a.messages + b.messages if m.message.ordering_key == "k0"]
    head, follower = k0[0], k0[1]
    before = engine.version("deliveries")
    # nack the head and extend its follower in one round: the cascade ends the follower (one row for it)
    answers = run_round(engine, rec, [OutcomeAsk((follower,), 60.0, True), OutcomeAsk((head,), 0.0, True)], clock)
    assert engine.version("deliveries") == before + 1
    assert answers[1] == [(head.message_id, head.delivery_attempt, Result.SUCCESS)]
    (again,) = run_round(engine, rec, [LeaseAsk(10, 10.0)], clock)
    again_k0 = [m.message.data for m in again.messages if m.message.ordering_key == "k0"]
    assert again_k0[:2] == [b"0", b"2"]  # the key comes again from its head, in order
