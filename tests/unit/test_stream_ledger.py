"""The streaming source's ledger decisions (policy.stream_ledger), in Spark's call orders."""

from __future__ import annotations

import pytest

from deltabus.policy.stream_ledger import (
    PENDING,
    PLANNED,
    Ledger,
    abandoned,
    absorb,
    acked,
    committed_by,
    drop,
    expire_unsettled,
    new_batch,
    parts_of,
    plan,
    probe,
)


def test_normal_order_plans_then_acks_the_batch_before():
    ledger, n1 = new_batch(Ledger())
    assert n1 == 1 and ledger.pending == 1
    ledger, to_ack = plan(ledger, 0, 1)  # first batch: start is the initial offset
    assert to_ack == [] and ledger.batches == {1: PLANNED} and ledger.pending is None
    ledger, n2 = new_batch(ledger)
    assert committed_by(ledger, 1) == [1]  # commit(end=1) arrives when batch 2 is planned
    ledger = acked(ledger, 1, [], 100.0)
    ledger, to_ack = plan(ledger, 1, 2)
    assert to_ack == [] and ledger.batches == {2: PLANNED} and ledger.next == 3


def test_only_one_pending_batch_at_a_time():
    ledger, _ = new_batch(Ledger())
    with pytest.raises(ValueError, match="still pending"):
        new_batch(ledger)
    with pytest.raises(ValueError, match="more than one pending"):
        Ledger(next=3, batches={1: PENDING, 2: PENDING})


def test_restart_probe_keeps_the_newest_logged_batch_and_acks_those_before():
    ledger = Ledger(next=5, batches={2: PLANNED, 3: PLANNED, 4: PENDING})
    after, to_ack = probe(ledger, 3)  # batch 3 may be replayed; 2 was committed; 4 is an orphan
    assert to_ack == [2] and after.batches == {2: PLANNED, 3: PLANNED, 4: PENDING} and after.pending == 4
    # A batch logged by Spark but not planned before the crash becomes planned at the probe.
    after, to_ack = probe(Ledger(next=5, batches={3: PLANNED, 4: PENDING}), 4)
    assert to_ack == [3] and after.batches == {3: PLANNED, 4: PLANNED} and after.pending is None


def test_an_orphan_is_planned_as_the_next_batch_and_a_missing_one_is_an_error():
    ledger = Ledger(next=5, batches={3: PLANNED, 4: PENDING})
    after, to_ack = plan(ledger, 3, 4)
    assert to_ack == [3] and after.batches[4] == PLANNED
    with pytest.raises(LookupError, match="new checkpoint"):
        plan(ledger, 3, 2)  # acked and gone: the checkpoint is not this ledger's


def test_replay_plans_the_same_batch_again():
    ledger = Ledger(next=4, batches={3: PLANNED})
    after, to_ack = plan(ledger, 2, 3)
    assert to_ack == [] and after.batches == {3: PLANNED}


def test_failed_acks_become_unsettled_until_they_expire():
    ledger = Ledger(next=3, batches={2: PLANNED})
    ledger = acked(ledger, 2, [("m1", 0)], 50.0)
    assert ledger.batches == {} and ledger.unsettled == {("m1", 0): 50.0}
    assert expire_unsettled(ledger, 49.0) is ledger
    assert expire_unsettled(ledger, 51.0).unsettled == {}


def test_absorb_never_emits_a_delivery_twice():
    leases = [("a", 0), ("b", 0), ("c", 0), ("a", 1)]
    out = absorb(leases, live={("a", 0): 3}, unsettled={("b", 0): 9.0})
    assert out.emit == [2, 3]  # ("a", 1): a seek made a new version, a genuine redelivery
    assert out.renewed == {("a", 0): 0} and out.ack_now == [1]


def test_keys_stay_in_one_part_in_order_and_keyless_rows_spread():
    keys = ["k1", "", "k2", "k1", "", "", "k1"]
    parts = parts_of(keys, 3)
    assert len({p for k, p in zip(keys, parts) if k == "k1"}) == 1
    assert [p for k, p in zip(keys, parts) if not k] == [0, 1, 2]
    assert parts_of(keys, 1) == [0] * len(keys)
    with pytest.raises(ValueError):
        parts_of(keys, 0)


def test_the_ledger_round_trips_through_json_and_refuses_nonsense():
    ledger = Ledger(next=7, batches={5: PLANNED, 6: PENDING}, unsettled={("m", 2): 10.5})
    assert Ledger.from_json(ledger.to_json()) == ledger
    with pytest.raises(ValueError, match="outside"):
        Ledger(next=2, batches={3: PLANNED})
    with pytest.raises(ValueError, match="state"):
        Ledger(next=2, batches={1: "done"})
    with pytest.raises(ValueError, match="next"):
        Ledger(next=0)


def test_a_plan_from_the_initial_offset_abandons_an_older_checkpoints_batches():
    ledger = Ledger(next=6, batches={3: PLANNED, 4: PLANNED, 5: PENDING})
    assert abandoned(ledger, 0, 5) == [3, 4]  # a new checkpoint: nothing of it was committed before
    assert abandoned(ledger, 4, 5) == []  # the same lineage: 3 and 4 are committed (acked instead)
    after, to_ack = plan(drop(ledger, [3, 4]), 0, 5)
    assert after.batches == {5: PLANNED} and to_ack == []
