"""Lease selection as pure functions: Arrow tables in, MERGE source rows and leases out."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from deltabus.delivery.fanout import FANOUT_ORDER, prepare
from deltabus.delivery.hooks import DeliveryHooks
from deltabus.delivery.merge import OPS_CLAUSES, SOURCE_SCHEMA
from deltabus.delivery.model import Lease, Op
from deltabus.delivery.selection import empty_available, select
from deltabus.delivery.cursor import empty_fanout
from deltabus.timestamps import TS

EXPIRES = 1_700_000_010_000_000


def available(*rows: tuple[str, int, int]) -> pa.Table:
    """(message_id, message_version, delivery_attempt) rows, all due now."""
    return pa.table(
        {
            "message_id": pa.array([r[0] for r in rows], pa.string()),
            "message_version": pa.array([r[1] for r in rows], pa.int64()),
            "publish_time": pa.array([0] * len(rows), TS),
            "delivery_attempt": pa.array([r[2] for r in rows], pa.int32()),
            "lease_expires": pa.nulls(len(rows), TS),
        }
    )


def fresh(*rows: tuple[str, int], keys: list[str] | None = None) -> pa.Table:
    """(message_id, message_version) new messages, in fan-out order."""
    return pa.table(
        {
            "message_id": pa.array([r[0] for r in rows], pa.string()),
            "publish_time": pa.array([0] * len(rows), TS),
            "ordering_key": pa.array(keys or [""] * len(rows), pa.string()),
            "size_bytes": pa.array([1] * len(rows), pa.int64()),
            "message_version": pa.array([r[1] for r in rows], pa.int64()),
        }
    )


def ops(parts: list[pa.Table]) -> list[tuple[str, str, int, int | None]]:
    source = pa.concat_tables(parts)
    assert source.schema == SOURCE_SCHEMA
    lease = source["lease_expires"].cast(pa.int64()).to_pylist()
    return list(zip(source["op"].to_pylist(), source["message_id"].to_pylist(), source["delivery_attempt"].to_pylist(), lease))


def test_redeliveries_first_then_new_messages_up_to_room() -> None:
    got = select("s1", available(("a", 3, 1), ("b", 4, 2)), fresh(("c", 7), ("d", 7), ("e", 8)), 3, EXPIRES)
    assert got.leases == [Lease("a", 2, 3), Lease("b", 3, 4), Lease("c", 1, 7)]
    assert ops(got.parts) == [
        ("lease", "a", 2, EXPIRES), ("lease", "b", 3, EXPIRES),
        ("insert", "c", 1, EXPIRES), ("insert", "d", 0, None), ("insert", "e", 0, None),
    ]
    assert got.inserted == 3 and got.given_up == 0
    assert set(pa.concat_tables(got.parts)["sub_uid"].to_pylist()) == {"s1"}


def test_no_room_inserts_every_new_message_unleased() -> None:
    got = select("s1", empty_available(), fresh(("c", 7), ("d", 8)), 0, EXPIRES)
    assert got.leases == []
    assert ops(got.parts) == [("insert", "c", 0, None), ("insert", "d", 0, None)]


def test_available_beyond_room_is_left_alone() -> None:
    got = select("s1", available(("a", 1, 0), ("b", 2, 1), ("c", 3, 0)), empty_fanout(), 2, EXPIRES)
    assert [l.message_id for l in got.leases] == ["a", "b"]
    assert ops(got.parts) == [("lease", "a", 1, EXPIRES), ("lease", "b", 2, EXPIRES)]


def test_nothing_to_do_is_no_source() -> None:
    got = select("s1", empty_available(), empty_fanout(), 10, EXPIRES)
    assert got.parts == [] and got.leases == [] and got.inserted == 0


def test_ordering_hook_holds_back_candidates() -> None:
    # One outstanding message per key, as issue 13 will ask: only the first of key "k" may go.
    def first_per_key(avail: pa.Table, new: pa.Table, _keys: object = None) -> tuple[pa.Array, pa.Array]:
        seen: set[str] = set()
        mask = []
        for key in new["ordering_key"].to_pylist():
            mask.append(key == "" or key not in seen)
            seen.add(key)
        return pa.array([True] * avail.num_rows, pa.bool_()), pa.array(mask, pa.bool_())

    hooks = DeliveryHooks(eligible=first_per_key)
    got = select("s1", empty_available(), fresh(("a", 1), ("b", 1), ("c", 2), keys=["k", "k", "j"]), 5, EXPIRES, hooks)
    assert [l.message_id for l in got.leases] == ["a", "c"]
    assert ops(got.parts) == [("insert", "a", 1, EXPIRES), ("insert", "b", 0, None), ("insert", "c", 1, EXPIRES)]


def test_attempt_limit_hook_gives_up_instead_of_leasing() -> None:
    hooks = DeliveryHooks(give_up=lambda attempts: pc.greater(attempts, 5))
    got = select("s1", available(("a", 1, 5), ("b", 2, 1)), empty_fanout(), 1, EXPIRES, hooks)
    assert got.given_up == 1
    assert got.leases == [Lease("b", 2, 2)]
    # the give-up row names the delivery that ran out (attempt 5), so a late ack still races it fairly
    assert ops(got.parts) == [("give_up", "a", 5, None), ("lease", "b", 2, EXPIRES)]


def test_fanout_sorted_by_version_then_id_and_filtered() -> None:
    rows = fresh(("b", 2), ("c", 1), ("a", 2))
    assert prepare(rows)["message_id"].to_pylist() == ["c", "a", "b"]
    kept = prepare(rows, keep=lambda t: pc.not_equal(t["message_id"], "a"))
    assert kept["message_id"].to_pylist() == ["c", "b"]
    assert FANOUT_ORDER[0][0] == "message_version"


def test_op_values_are_the_merge_vocabulary() -> None:
    assert {o.value for o in Op} == {"insert", "lease", "ack", "nack", "deadline", "give_up", "cascade", "seek_drop", "seek_keep", "history"}
    assert set(OPS_CLAUSES) == set(Op)  # every op has its MERGE clause


def sized(table: pa.Table, sizes: list[int | None]) -> pa.Table:
    """`table` with its size_bytes set (available rows gain the column)."""
    col = pa.array(sizes, pa.int64())
    if "size_bytes" in table.column_names:
        return table.set_column(table.schema.get_field_index("size_bytes"), "size_bytes", col)
    return table.append_column("size_bytes", col)


def test_max_bytes_leases_the_candidates_that_fit_in_order() -> None:
    due = sized(available(("a", 3, 1), ("b", 4, 1)), [400, 300])
    new = sized(fresh(("c", 7), ("d", 7), ("e", 8)), [200, 100, 50])
    got = select("s1", due, new, 10, EXPIRES, max_bytes=900)
    assert [l.message_id for l in got.leases] == ["a", "b", "c"] and got.leased_bytes == 900
    # the first that does not fit ends the leasing (d would fit after c did not: no skipping ahead)
    got = select("s1", due, new, 10, EXPIRES, max_bytes=850)
    assert [l.message_id for l in got.leases] == ["a", "b"] and got.leased_bytes == 700
    assert ops(got.parts)[2:] == [("insert", "c", 0, None), ("insert", "d", 0, None), ("insert", "e", 0, None)]
    got = select("s1", due, new, 10, EXPIRES, max_bytes=None)  # no cap: every one, room permitting
    assert len(got.leases) == 5 and got.leased_bytes == 0  # (not counted without a cap)


def test_a_message_larger_than_the_cap_goes_alone_only_when_oversize_is_allowed() -> None:
    due = sized(available(("big", 3, 1), ("a", 4, 1)), [10_000, 10])
    assert select("s1", due, fresh(), 10, EXPIRES, max_bytes=1_000).leases == []
    got = select("s1", due, fresh(), 10, EXPIRES, max_bytes=1_000, oversize_ok=True)
    assert [l.message_id for l in got.leases] == ["big"] and got.leased_bytes == 10_000
    got = select("s1", sized(available(), []), sized(fresh(("big", 7), ("c", 7)), [5_000, 1]), 10, EXPIRES, max_bytes=0,
                 oversize_ok=True)
    assert [l.message_id for l in got.leases] == ["big"]


def test_max_bytes_counts_missing_sizes_as_zero_and_respects_room() -> None:
    due = sized(available(("a", 3, 1), ("b", 4, 1), ("c", 5, 1)), [None, 5, 5])
    got = select("s1", due, fresh(), 2, EXPIRES, max_bytes=100)
    assert [l.message_id for l in got.leases] == ["a", "b"] and got.leased_bytes == 5


def test_a_redelivery_that_does_not_fit_ends_the_leasing_for_fresh_messages_too() -> None:
    """The first candidate that does not fit ends the leasing, redeliveries included: else
    fresh messages take the room left every batch, and under a saturated byte cap a large
    redelivery (or one whose earlier push failed) would wait behind them forever."""
    due = sized(available(("big", 3, 1)), [1_000])
    new = sized(fresh(("c", 7), ("d", 8)), [10, 10])
    got = select("s1", due, new, 10, EXPIRES, max_bytes=500)
    assert got.leases == [] and got.leased_bytes == 0 and got.bytes_blocked
    assert ops(got.parts) == [("insert", "c", 0, None), ("insert", "d", 0, None)]  # fanned out, not leased
    got = select("s1", due, new, 10, EXPIRES, max_bytes=1_010)  # it fits: then the fresh ones, as far as they fit
    assert [l.message_id for l in got.leases] == ["big", "c"] and got.leased_bytes == 1_010
