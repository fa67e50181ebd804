"""server.group_commit on real Delta tables: many callers of one subscription, ONE commit
(new messages alone: an append answered before the round's outcomes commit); one outcome
per message (ack wins, else the last deadline change); ids with an outcome are not leased
in the same round; per-caller lease lengths; per-id results; deferred deadline changes ride
in the next round."""

from __future__ import annotations

import asyncio

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from deltabus import ackid
from deltabus.delivery.model import Result
from deltabus.errors import Cancelled, ClockUncertain
from deltabus.policy.clock_skew import ClockSkewPolicy
from deltabus.registry import Registry
from deltabus.server import group_commit
from deltabus.server.group_commit import GroupCommits, Granted, LeaseAsk, OutcomeAsk, run_round
from deltabus.storage import open_engine
from deltabus.storage.clock import StorageClock
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


def _ops(engine, n: int) -> list[str]:
    """The operations of the deliveries table's last `n` commits, oldest first."""
    return [h["operation"] for h in reversed(DeltaTable(engine.table_uri("deliveries")).history(n))]


def test_new_messages_are_appended_and_answered_before_the_round_s_acks_commit(pub, sub, topic, subscription, warehouse, clock) -> None:
    pub.publish_batch(topic, [{"data": b"a"}])
    engine, rec = _setup(warehouse, clock, subscription)
    before = engine.version("deliveries")
    (first,) = run_round(engine, rec, [LeaseAsk(5, 10.0)], clock)
    (x,) = _ids(first)
    assert engine.version("deliveries") == before + 1 and _ops(engine, 1) == ["WRITE"]  # new messages only: an append
    fresh = pub.publish_batch(topic, [{"data": b"b"}, {"data": b"c"}])
    seen: list[tuple[dict, list[str]]] = []

    def early(answers) -> None:  # the leases are committed; x's ack is not yet
        rows = engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid)
        seen.append((answers, sorted(rows["message_id"].to_pylist())))

    answers = run_round(engine, rec, [OutcomeAsk((x,), None, True), LeaseAsk(5, 10.0)], clock, early=early)
    assert _ops(engine, 2) == ["WRITE", "MERGE"]  # the new messages' append, then the ack's MERGE
    ((handed, table_then),) = seen
    assert list(handed) == [1] and handed[1] is answers[1]  # only the lease ask, the same answer
    assert [i.message_id for i in _ids(answers[1])] == fresh
    assert table_then == sorted([x.message_id, *fresh])  # x still there when the leases went out
    assert answers[0] == [(x.message_id, x.delivery_attempt, Result.SUCCESS)]
    rows = engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid)
    assert sorted(rows["message_id"].to_pylist()) == sorted(fresh)  # x acked


def test_a_round_with_redeliveries_stays_one_merge(pub, sub, topic, subscription, warehouse, clock) -> None:
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(5, 10.0)], clock)
    x, y = _ids(first)
    fresh = pub.publish_batch(topic, [{"data": b"c"}])
    run_round(engine, rec, [OutcomeAsk((y,), 0.0)], clock)  # y nacked: due again
    before = engine.version("deliveries")
    called = []
    answers = run_round(engine, rec, [OutcomeAsk((x,), None), LeaseAsk(5, 10.0)], clock, early=called.append)
    assert engine.version("deliveries") == before + 1 and _ops(engine, 1) == ["MERGE"] and called == []
    assert sorted(i.message_id for i in _ids(answers[1])) == sorted([y.message_id, *fresh])  # y again, and c


def test_a_deferred_deadline_change_rides_in_the_next_round_or_commits_alone_after_a_while(
    pub, sub, topic, subscription, warehouse
) -> None:
    """A deferred change (the stream's receipt modack) starts no round, not even right after
    a running round; the next ack's round carries it, else it commits alone after
    `defer_seconds`; its lease ends `seconds` after it was asked (not after its round)."""
    import time

    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(4)])
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).subscription(subscription)

    def lease_of(message_id: str) -> int:
        rows = engine.snapshot("deliveries").read(["message_id", "lease_expires"], partition=rec.sub_uid)
        return dict(zip(rows["message_id"].to_pylist(), pc.cast(rows["lease_expires"], "int64").to_pylist()))[message_id]

    async def scenario() -> None:
        commits = GroupCommits(engine, lambda name: rec, time.time, defer_seconds=1.0)
        granted = await commits.lease(subscription, 4, 600.0)
        w, x, y, z = _ids(granted)
        rounds = commits.rounds
        ack = asyncio.ensure_future(commits.acknowledge(subscription, [w]))  # a round running...
        while commits.rounds == rounds:  # (counted when its batch is taken)
            await asyncio.sleep(0)
        assert not ack.done()
        asked = time.time()
        done = commits.submit_modify_deadline(subscription, [x, y], 20.0, defer=True)  # ...when this is queued
        await ack
        await asyncio.sleep(0.3)
        assert commits.rounds == rounds + 1 and not done.done()  # no round of its own after the running one
        assert lease_of(x.message_id) > to_us(asked + 500)  # still the 600 s lease
        await commits.acknowledge(subscription, [y])  # the ack's round carries it
        assert commits.rounds == rounds + 2 and done.done() and done.result() is None
        assert abs(lease_of(x.message_id) - to_us(asked + 20.0)) < 50_000  # 20 s from when it was asked (0.3 s ago)
        late = commits.submit_modify_deadline(subscription, [z], 30.0, defer=True)
        await asyncio.sleep(0.3)
        assert not late.done()
        await asyncio.wait_for(late, 5.0)  # alone, once defer_seconds passed
        assert commits.rounds == rounds + 3
        assert lease_of(z.message_id) >= to_us(asked + 30.0)

    asyncio.run(scenario())


def test_a_round_leases_no_message_whose_ack_is_still_queued_even_when_its_lease_ran_out(
    pub, sub, topic, subscription, warehouse, clock
) -> None:
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(2, 10.0)], clock)
    x, y = _ids(first)
    clock.advance(11.0)  # both leases ran out
    (held,) = run_round(engine, rec, [LeaseAsk(5, 10.0)], clock, held=frozenset({x.message_id}))
    assert [i.message_id for i in _ids(held)] == [y.message_id]  # x's ack is queued for a later round
    clock.advance(11.0)
    (free,) = run_round(engine, rec, [LeaseAsk(5, 10.0)], clock)
    assert sorted(i.message_id for i in _ids(free)) == sorted([x.message_id, y.message_id])


def test_the_server_s_rounds_lease_no_message_whose_deferred_ack_is_not_yet_committed(
    pub, sub, topic, subscription, warehouse, clock
) -> None:
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    engine, rec = _setup(warehouse, clock, subscription)

    async def scenario() -> None:
        commits = GroupCommits(engine, lambda name: rec, clock, defer_seconds=30.0)
        x, y = _ids(await commits.lease(subscription, 2, 10.0))
        done = commits.submit_acknowledge(subscription, [x])  # journaled: goes in 30 s
        clock.advance(11.0)  # both leases ran out
        again = _ids(await commits.lease(subscription, 5, 10.0))
        assert [i.message_id for i in again] == [y.message_id]  # not x: its ack waits to commit
        assert not done.done()
        await commits.flush(subscription)
        assert done.done() and done.result() is None
        clock.advance(11.0)
        assert _ids(await commits.lease(subscription, 5, 10.0))[0].message_id == y.message_id  # x is acked

    asyncio.run(scenario())


def test_a_flush_before_a_snapshot_raises_when_a_round_left_deferred_acks_uncommitted(
    pub, sub, topic, subscription, warehouse, clock
) -> None:
    """CreateSnapshot flushes the subscription's deferred acks before it reads: a round that
    fails (here its lookup, as a storage error would) must fail the flush, not let the
    snapshot read those acks as unacked."""
    from deltabus.errors import Aborted

    pub.publish_batch(topic, [{"data": b"x"}])
    engine, rec = _setup(warehouse, clock, subscription)
    failing = [False]

    def lookup(name: str):
        if failing[0]:
            failing[0] = False
            raise Aborted("storage kept conflicting")
        return rec

    async def scenario() -> None:
        commits = GroupCommits(engine, lookup, clock, defer_seconds=30.0)
        (x,) = _ids(await commits.lease(subscription, 1, 60.0))
        done = commits.submit_acknowledge(subscription, [x])
        failing[0] = True
        with pytest.raises(Aborted):
            await commits.flush(subscription)
        assert isinstance(done.exception(), Aborted)
        again = commits.submit_acknowledge(subscription, [x])  # (as StreamHub queues a failed one again)
        await commits.flush(subscription)
        assert again.result() is None

    asyncio.run(scenario())


def test_a_deferred_ack_goes_within_defer_seconds_even_while_lease_asks_keep_coming(pub, sub, topic, subscription, warehouse) -> None:
    """A journaled ack (``submit_acknowledge``) starts no round and rides in none of lease asks
    alone, but once it waited `defer_seconds` it goes in the next round whatever that holds:
    a stream's steady lease asks must not hold it back (they once did, indefinitely)."""
    import time

    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(3)])
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).subscription(subscription)

    def rows() -> set[str]:
        return set(engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid)["message_id"].to_pylist())

    async def scenario() -> None:
        commits = GroupCommits(engine, lambda name: rec, time.time, defer_seconds=0.4)
        x, y, z = _ids(await commits.lease(subscription, 3, 600.0))
        done = commits.submit_acknowledge(subscription, [x])
        queued = asyncio.get_running_loop().time()
        leases = 0
        while not done.done() and asyncio.get_running_loop().time() - queued < 10.0:
            await commits.lease(subscription, 5, 600.0)  # finds nothing: a lease round, again and again
            leases += 1
            if asyncio.get_running_loop().time() - queued < 0.3:
                assert not done.done()  # it rode in none of the lease rounds before its time
        assert done.done() and done.result() is None, f"still queued after {leases} lease rounds"
        assert leases >= 2
        assert rows() == {y.message_id, z.message_id}  # x's row is gone: acked
        # flush (a clean stop): a deferred ack commits at once; a lease ask queued then fails
        ack = commits.submit_acknowledge(subscription, [y])
        lease = asyncio.ensure_future(commits.lease(subscription, 5, 600.0))
        await asyncio.sleep(0)
        await commits.flush()
        assert ack.done() and ack.result() is None
        assert rows() == {z.message_id}
        with pytest.raises(Cancelled):
            await lease

    asyncio.run(scenario())


def test_a_split_round_answers_its_leases_before_its_acks_commit(pub, sub, topic, subscription, warehouse) -> None:
    import time

    pub.publish_batch(topic, [{"data": b"a"}])
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).subscription(subscription)

    async def scenario() -> None:
        commits = GroupCommits(engine, lambda name: rec, time.time)
        (x,) = _ids(await commits.lease(subscription, 5, 60.0))
        pub.publish_batch(topic, [{"data": b"b"}, {"data": b"c"}])
        blocker = asyncio.ensure_future(commits.acknowledge(subscription, []))  # (no ids: answered at once)
        await blocker
        ack = asyncio.ensure_future(commits.acknowledge(subscription, [x]))
        lease = asyncio.ensure_future(commits.lease(subscription, 5, 60.0))
        got = await lease
        assert len(got.messages) == 2
        assert not ack.done()  # the ack's MERGE is still running: the leases went out first
        await ack
        assert commits.rounds == 2  # the first lease, then one round with both calls

    asyncio.run(scenario())


def test_a_kill_between_the_leases_append_and_the_acks_merge_loses_nothing(pub, sub, topic, subscription, warehouse, clock) -> None:
    """SIGKILL after a split round handed out its new messages' leases and before its ack
    committed: the ack was never answered (the client sends it again), and once the leases
    run out every message, the unacked one included, is delivered again."""
    import json
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    pub.publish_batch(topic, [{"data": b"a"}])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(5, 10.0)], clock)
    (x,) = _ids(first)
    fresh = pub.publish_batch(topic, [{"data": b"b"}, {"data": b"c"}])
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "lib"), str(root)])}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_split_round_worker.py")), warehouse, subscription,
                           ackid.encode(*x)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == fresh  # handed over, then killed before the ack's MERGE
    rows = engine.snapshot("deliveries").read(["message_id", "delivery_attempt"], partition=rec.sub_uid)
    assert dict(zip(rows["message_id"].to_pylist(), rows["delivery_attempt"].to_pylist())) == {
        x.message_id: 1, fresh[0]: 1, fresh[1]: 1}  # the leases committed; x not acked
    clock.advance(60.0)  # every lease ran out
    (again,) = run_round(engine, rec, [LeaseAsk(10, 10.0)], clock)
    assert sorted(i.message_id for i in _ids(again)) == sorted([x.message_id, *fresh])


def _uncertain_clock(clock: ManualClock) -> StorageClock:
    """A StorageClock over `clock` whose offset is known only to ±0.5 s, refusing leases
    (max_uncertainty 0.1 s)."""
    storage = StorageClock(clock, ClockSkewPolicy(max_uncertainty=0.1), monotonic=lambda: clock() - 1000.0)
    storage.committed(clock() - 1.0, clock(), int((clock() - 0.5) * 1e9))  # one write timed to within 1 s
    with pytest.raises(ClockUncertain):
        storage.latest()
    return storage


def test_a_clock_refusal_fails_only_the_leases_and_extensions_acks_and_nacks_commit(
    pub, sub, topic, subscription, warehouse, clock
) -> None:
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(4)])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(3, 10.0)], clock)
    x, y, z = _ids(first)
    answers = run_round(engine, rec, [
        OutcomeAsk((x,), None, True),  # ack
        OutcomeAsk((y,), 0.0),  # nack
        OutcomeAsk((z,), 30.0, True),  # extension: needs the storage's latest time
        LeaseAsk(10, 10.0),
    ], _uncertain_clock(clock))
    assert answers[0] == [(x.message_id, x.delivery_attempt, Result.SUCCESS)] and answers[1] is None
    assert isinstance(answers[2], ClockUncertain) and isinstance(answers[3], ClockUncertain)
    rows = engine.snapshot("deliveries").read(["message_id", "lease_expires"], partition=rec.sub_uid)
    lease = dict(zip(rows["message_id"].to_pylist(), pc.cast(rows["lease_expires"], "int64").to_pylist()))
    assert x.message_id not in lease and lease[y.message_id] <= 1  # acked, nacked
    assert lease[z.message_id] == to_us(clock() + 10.0)  # not extended
    assert len(lease) == 3  # the 4th message was not leased


def test_a_clock_refusal_in_a_served_round_fails_the_lease_caller_alone(
    pub, sub, topic, subscription, warehouse, clock
) -> None:
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])
    engine, rec = _setup(warehouse, clock, subscription)
    (first,) = run_round(engine, rec, [LeaseAsk(1, 10.0)], clock)
    (x,) = _ids(first)
    commits = GroupCommits(engine, lambda name: Registry(engine, clock=clock).subscription(name), _uncertain_clock(clock))

    async def scenario() -> None:
        ack = asyncio.ensure_future(commits.acknowledge(subscription, [x], want_results=True))
        lease = asyncio.ensure_future(commits.lease(subscription, 5, 10.0))
        assert await ack == [(x.message_id, x.delivery_attempt, Result.SUCCESS)]
        with pytest.raises(ClockUncertain):
            await lease
        assert commits.rounds == 1

    asyncio.run(scenario())


def test_a_round_with_acks_waits_briefly_for_the_other_busy_streams_acks(pub, sub, topic, subscription, warehouse, monkeypatch) -> None:
    """`peers`: an ack round waits (at most PEER_LINGER) until every busy source queued an
    outcome, so two streams' acks share one MERGE; a source that never comes holds it only
    PEER_LINGER; with every peer present (or none expected) it waits for nothing."""
    import time

    monkeypatch.setattr(group_commit, "PEER_LINGER", 0.5)
    monkeypatch.setattr(group_commit, "PEER_LINGER_IDS", 1)
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(6)])
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).subscription(subscription)
    busy: set[object] = set()

    async def scenario() -> None:
        commits = GroupCommits(engine, lambda name: rec, time.time, peers=lambda name: frozenset(busy))
        w, x, y, z, u, v = _ids(await commits.lease(subscription, 6, 600.0))
        busy.update({"a", "b"})
        rounds = commits.rounds
        first = asyncio.ensure_future(commits.acknowledge(subscription, [w], source="a"))
        await asyncio.sleep(0.1)
        assert commits.rounds == rounds  # waiting for b
        t0 = time.monotonic()
        await asyncio.gather(first, commits.acknowledge(subscription, [x], source="b"))
        assert commits.rounds == rounds + 1  # one round for both
        assert time.monotonic() - t0 < 0.4
        t0 = time.monotonic()
        await commits.acknowledge(subscription, [y], source="a")  # b never comes: PEER_LINGER
        assert 0.4 < time.monotonic() - t0 and commits.rounds == rounds + 2
        busy.discard("b")
        t0 = time.monotonic()
        await commits.acknowledge(subscription, [z], source="a")  # nobody else busy: at once
        assert time.monotonic() - t0 < 0.4 and commits.rounds == rounds + 3
        busy.add("b")
        monkeypatch.setattr(group_commit, "PEER_LINGER_IDS", 2)
        t0 = time.monotonic()
        await commits.acknowledge(subscription, [u], source="a")  # a small call (its client keeps up): at once
        assert time.monotonic() - t0 < 0.4 and commits.rounds == rounds + 4
        monkeypatch.setattr(group_commit, "PEER_LINGER_IDS", 1)
        t0 = time.monotonic()
        ack = asyncio.ensure_future(commits.acknowledge(subscription, [v], source="a"))
        await asyncio.sleep(0.05)
        await commits.lease(subscription, 1, 600.0, source="c")  # a stream asking with no ack queued: nobody waits
        await ack
        assert time.monotonic() - t0 < 0.4 and commits.rounds == rounds + 5

    asyncio.run(scenario())
    left = engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid)
    assert left.num_rows == 0
