"""The delivery history's pure policy (deltabus.delivery.history): which outcome each event is
recorded as, the status words, the day partitions, and the settings' validation."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltabus.delivery import history
from deltabus.delivery.history import OFF, RECORD, HistorySettings
from deltabus.delivery.merge import SOURCE_SCHEMA, clauses_for, pinned_on, source_rows
from deltabus.delivery.model import Op
from deltabus.errors import InvalidArgument
from deltabus.storage.tables import DELIVERIES, HISTORY_PREFIX
from deltabus.timestamps import TS

DAY_US = 86_400_000_000
T = 1_795_000_000_000_000  # 2026-11-18, some time of day (us)


def triples(t: pa.Table) -> list[tuple]:
    return list(zip(t["message_id"].to_pylist(), t["delivery_attempt"].to_pylist(), t["attempt_outcome"].to_pylist(),
                    t["attempt_status"].to_pylist()))


def test_rows_are_insert_only_source_rows_in_their_days_partition() -> None:
    t = history.rows(HistorySettings(worker="w1"), "projects/p/subscriptions/s", pa.array(["a", "b"]), pa.array([1, 2], pa.int32()),
                     "lease", pa.array([T, T + DAY_US], pa.int64()))
    assert t.schema == SOURCE_SCHEMA
    assert t["op"].to_pylist() == ["history", "history"]
    assert t["sub_uid"].to_pylist() == [history.partition_of(T), history.partition_of(T + DAY_US)]
    assert history.partition_of(T) == f"{HISTORY_PREFIX}2026-11-18"
    assert t["attempt_worker"].to_pylist() == ["w1", "w1"] and t["attempt_subscription"].to_pylist() == ["projects/p/subscriptions/s"] * 2
    assert t["lease_expires"].null_count == 2  # never a delivery's state
    assert history.rows(OFF, "s", pa.array(["a"]), pa.array([1], pa.int32()), "lease", T).num_rows == 0
    with pytest.raises(ValueError, match="outcome"):
        history.rows(RECORD, "s", pa.array(["a"]), pa.array([1], pa.int32()), "maybe", T)  # type: ignore[arg-type]


def test_settings_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="history.worker"):
        HistorySettings(worker="")
    with pytest.raises(InvalidArgument, match="history.enabled"):
        HistorySettings(enabled="yes")  # type: ignore[arg-type]
    assert HistorySettings().enabled and ":" in HistorySettings().worker


def test_a_lease_decision_records_leases_give_ups_and_the_expiries_it_saw() -> None:
    available = pa.table({
        "message_id": pa.array(["ran-out", "nacked", "never", "limit"]),
        "delivery_attempt": pa.array([1, 2, 0, 5], pa.int32()),
        "lease_expires": pa.array([T - 5_000_000, 0, None, T - 1_000_000], TS),
    })
    lease = available.slice(0, 3)
    parts = [
        source_rows(Op.LEASE, "s1", lease, pa.array([2, 3, 1], pa.int32()), pa.repeat(pa.scalar(T + 10_000_000, TS), 3)),
        source_rows(Op.GIVE_UP, "s1", available.slice(3), available.slice(3)["delivery_attempt"], pa.nulls(1, TS)),
        source_rows(Op.INSERT, "s1", pa.table({"message_id": ["new", "later"]}), pa.array([1, 0], pa.int32()),
                    pa.array([T + 10_000_000, None], TS)),
    ]
    got = pa.concat_tables(history.for_leases(RECORD, "sub", parts, available, T))
    assert sorted(triples(got)) == sorted([
        ("ran-out", 2, "lease", None), ("nacked", 3, "lease", None), ("never", 1, "lease", None), ("new", 1, "lease", None),
        ("limit", 5, "dead_lettered", None),
        # Only leases that ran out expired: a nack is no expiry, nor is a message never delivered.
        ("ran-out", 1, "expired", None), ("limit", 5, "expired", None),
    ])
    expired = got.filter(pa.compute.equal(got["attempt_outcome"], "expired"))
    assert sorted(expired["attempt_time"].cast(pa.int64()).to_pylist()) == [T - 5_000_000, T - 1_000_000]  # the old deadlines
    assert history.for_leases(OFF, "sub", parts, available, T) == []


def test_outcomes_that_did_not_apply_are_recorded_as_stale() -> None:
    requested = pa.table({"message_id": ["a", "b"], "delivery_attempt": pa.array([1, 3], pa.int32())})
    got = history.for_outcomes(RECORD, "sub", requested, pa.array(["a"]), "ack", T)
    assert triples(got) == [("a", 1, "ack", None), ("b", 3, "stale", "ack")]


def test_push_outcomes_carry_status_latency_and_staleness() -> None:
    outcomes = pa.table({
        "message_id": ["ok", "503", "slow", "refused", "late", "gone"],
        "delivery_attempt": pa.array([1, 1, 2, 1, 1, 4], pa.int32()),
        "outcome": ["ack", "nack", "timeout", "error", "expired", "ack"],
        "status": pa.array([204, 503, 0, 0, 0, 200], pa.int32()),
        "error": ["", "", "", "connection refused", "", ""],
        "latency_seconds": [0.004, 0.002, 10.0, 0.001, 0.0, 0.003],
    })
    got = history.for_push(RECORD, "sub", outcomes, outcomes.slice(0, 5).select(["message_id", "delivery_attempt"]), T)
    assert triples(got) == [
        ("ok", 1, "push_ok", "http 204"), ("503", 1, "push_failed", "http 503"), ("slow", 2, "push_failed", "timeout"),
        ("refused", 1, "push_failed", "connection refused"), ("late", 1, "push_failed", "expired"),
        ("gone", 4, "stale", "push_ok http 200"),  # its delivery was no longer current: the ack did not apply
    ]
    assert got["attempt_latency_ms"].to_pylist() == pytest.approx([4.0, 2.0, 10_000.0, 1.0, 0.0, 3.0])
    bare = history.for_push(RECORD, "sub", outcomes.select(["message_id", "delivery_attempt"]), outcomes.slice(0, 1).select(["message_id", "delivery_attempt"]), T)
    assert bare.num_rows == 6  # outcomes reported without detail are still recorded


def test_history_rows_are_kept_out_of_the_join_and_only_ever_insert() -> None:
    assert pinned_on(["s1"], history=True).endswith("AND s.op <> 'history'")
    assert "history" not in pinned_on(["s1"])  # unchanged without history rows
    assert "t.sub_uid = s.sub_uid" in pinned_on(["s1", "s2"], history=True)  # several: the join keeps them out already
    [clause] = clauses_for([Op.HISTORY])
    assert type(clause).__name__ == "NotMatchedInsert" and clause.when == "s.op = 'history'"
    assert DELIVERIES.insert_only_prefix == HISTORY_PREFIX
