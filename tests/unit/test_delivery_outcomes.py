"""Outcomes as pure decisions: current rows and requested deliveries in, results and source out."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltabus.delivery.merge import NACKED_US, OPS_MERGE, clauses_for, pinned_on
from deltabus.delivery.model import IdResult, Op, OutcomeKind, Result
from deltabus.delivery.hooks import DEFAULT_HOOKS, DeliveryHooks
from deltabus.delivery.outcomes import decide, latest_per_message, nack_lease, rows
from deltabus.timestamps import TS

LEASED = 1_700_000_000_000_000
OK, BAD = Result.SUCCESS, Result.INVALID_ACK_ID


def current(*rows_: tuple[str, int, int | None]) -> pa.Table:
    """(message_id, delivery_attempt, lease_expires us or None) rows in the snapshot."""
    return pa.table(
        {
            "message_id": pa.array([r[0] for r in rows_], pa.string()),
            "delivery_attempt": pa.array([r[1] for r in rows_], pa.int32()),
            "lease_expires": pa.array([r[2] for r in rows_], TS),
        }
    )


def source(table: pa.Table) -> list[tuple[str, str, int, int | None]]:
    lease = table["lease_expires"].cast(pa.int64()).to_pylist()
    return list(zip(table["op"].to_pylist(), table["message_id"].to_pylist(), table["delivery_attempt"].to_pylist(), lease))


def test_ack_succeeds_only_for_the_current_delivery() -> None:
    now = current(("a", 2, LEASED), ("b", 1, LEASED))
    got = decide("s1", OutcomeKind.ACK, [("a", 2), ("b", 3), ("gone", 1), ("b", 1)], now)
    # b is requested twice: the latest attempt (3) is kept and it is not b's current delivery
    assert got.results == [IdResult("a", 2, OK), IdResult("b", 3, BAD), IdResult("gone", 1, BAD), IdResult("b", 1, BAD)]
    assert source(got.source) == [("ack", "a", 2, None)]


def test_an_ack_id_naming_another_row_version_does_not_apply() -> None:
    """A seek brings an acked message back as a new row whose attempts restart, with a new
    (negative) version: an ack id of the old delivery names the same attempt but its old
    version, and does not apply; ids without a version (the older format) match any."""
    now = current(("a", 1, LEASED), ("b", 1, LEASED)).append_column("message_version", pa.array([-99, 7], pa.int64()))
    got = decide("s1", OutcomeKind.ACK, [("a", 1, 7), ("b", 1, 7)], now)
    assert got.results == [IdResult("a", 1, BAD), IdResult("b", 1, OK)]
    assert decide("s1", OutcomeKind.ACK, [("a", 1, None)], now).results == [IdResult("a", 1, OK)]
    assert decide("s1", OutcomeKind.DEADLINE, [("a", 1, -99)], now, LEASED + 1).results == [IdResult("a", 1, OK)]


def test_an_expired_lease_still_acks_while_nobody_else_holds_it() -> None:
    got = decide("s1", OutcomeKind.ACK, [("a", 1)], current(("a", 1, 5)))
    assert got.results == [IdResult("a", 1, OK)]


def test_nack_ends_the_lease_at_the_sentinel_and_skips_undelivered_rows() -> None:
    got = decide("s1", OutcomeKind.NACK, [("a", 1), ("never", 0)], current(("a", 1, LEASED), ("never", 0, None)))
    assert [r.result for r in got.results] == [OK, BAD]
    assert source(got.source) == [("nack", "a", 1, NACKED_US)]


def test_extension_never_revives_a_nacked_row() -> None:
    later = LEASED + 30_000_000
    now = current(("a", 1, NACKED_US), ("b", 1, LEASED), ("c", 1, None))
    got = decide("s1", OutcomeKind.DEADLINE, [("a", 1), ("b", 1), ("c", 1)], now, later)
    assert [r.result for r in got.results] == [BAD, OK, BAD]
    assert source(got.source) == [("deadline", "b", 1, later)]


def test_nothing_applies_means_an_empty_source() -> None:
    got = decide("s1", OutcomeKind.ACK, [("x", 1)], current())
    assert got.results == [IdResult("x", 1, BAD)] and got.source.num_rows == 0


def test_retry_delay_array_follows_the_applied_rows() -> None:
    now = current(("a", 1, LEASED), ("b", 1, LEASED))
    delays = pa.array([111, 222], pa.int64())  # one per message of latest_per_message, in order a, b
    got = decide("s1", OutcomeKind.NACK, [("a", 9), ("b", 1)], now, delays)
    assert source(got.source) == [("nack", "b", 1, 222)]


def test_nack_lease_applies_the_retry_hook_with_the_given_now() -> None:
    keyed = latest_per_message([("a", 2), ("b", 1)])
    assert nack_lease(DEFAULT_HOOKS, keyed, 5.0) is None  # default: the NACKED sentinel
    seen: list[tuple[list[str], float]] = []

    def backoff(nacked: pa.Table, now: float) -> pa.Array:
        seen.append((nacked["message_id"].to_pylist(), now))
        return pa.array([int(now * 1e6) + 10 * a for a in nacked["delivery_attempt"].to_pylist()], pa.int64())

    got = nack_lease(DeliveryHooks(retry_delay=backoff), keyed, 5.0)
    assert seen == [(["a", "b"], 5.0)]
    assert got is not None and got.to_pylist() == [5_000_020, 5_000_010]


def test_rows_without_reading() -> None:
    keyed = latest_per_message([("a", 1), ("a", 3), ("b", 2)])
    assert keyed.to_pylist() == [{"message_id": "a", "delivery_attempt": 3, "message_version": None},
                                 {"message_id": "b", "delivery_attempt": 2, "message_version": None}]
    assert source(rows("s1", OutcomeKind.ACK, keyed)) == [("ack", "a", 3, None), ("ack", "b", 2, None)]
    assert source(rows("s1", OutcomeKind.EXPIRY, keyed))[0] == ("nack", "a", 3, NACKED_US)
    with pytest.raises(ValueError, match="lease_expires_us"):
        rows("s1", OutcomeKind.DEADLINE, keyed)


def test_merge_clauses_per_op_and_pinning() -> None:
    assert clauses_for([Op.ACK]) == [OPS_MERGE[0]]
    assert clauses_for([Op.INSERT, Op.LEASE, Op.ACK]) == [c for c in OPS_MERGE if c in clauses_for([Op.INSERT, Op.LEASE, Op.ACK])]
    assert len(clauses_for(list(Op))) == len(OPS_MERGE)
    assert pinned_on(["u1"]) == "t.sub_uid = 'u1' AND t.message_id = s.message_id"
    assert pinned_on(["u2", "u1"]).startswith("t.sub_uid IN ('u1', 'u2') AND t.sub_uid = s.sub_uid")
    with pytest.raises(ValueError):
        pinned_on(["bad'uid"])


def test_of_two_ids_with_one_attempt_the_lower_version_is_the_later_delivery() -> None:
    """After a seek brings an acked message back, its new first delivery has attempt 1 like
    the old one; the new row's version is the seek's (lower) epoch. Both ids in one call:
    the current one applies, whichever comes first."""
    now = current(("m1", 1, LEASED)).append_column("message_version", pa.array([-5], pa.int64()))
    for order in ([("m1", 1, 7), ("m1", 1, -5)], [("m1", 1, -5), ("m1", 1, 7)]):
        got = decide("s1", OutcomeKind.ACK, order, now)
        assert {r.result for r in got.results} == {OK, BAD} and source(got.source) == [("ack", "m1", 1, None)]
        assert [r.result for r in got.results] == [OK if v == -5 else BAD for _, _, v in order]


def test_an_exact_commit_is_short_when_an_applied_cascade_hides_a_refused_nack() -> None:
    """delta-spark: a NACK of A refused (A acked in the window before its MERGE read) and a
    CASCADE of B applied make one update; the exact check must still see the nack missing."""
    from deltabus.delivery.merge import _short, cascade_rows, source_rows
    from deltabus.delivery.operations import DECIDED

    t = pa.table({"message_id": pa.array(["A"]), "delivery_attempt": pa.array([1], pa.int32())})
    nacked = source_rows(Op.NACK, "u", t, t["delivery_attempt"], pa.array([0], TS))
    cascaded = cascade_rows("u", pa.table({"message_id": pa.array(["B"]), "delivery_attempt": pa.array([1], pa.int32())}))
    both = pa.concat_tables([nacked, cascaded])
    assert _short({"num_target_rows_updated": 1}, both, DECIDED) is not None
    assert _short({"num_target_rows_updated": 2}, both, DECIDED) is None


def test_a_marked_row_takes_no_outcome() -> None:
    now = current(("a", 5, LEASED)).append_column("message_version", pa.array([3], pa.int64()))
    now = now.append_column("dead_letter_key", pa.array([77], pa.int64()))
    for kind in (OutcomeKind.ACK, OutcomeKind.NACK):
        got = decide("s1", kind, [("a", 5, 3)], now)
        assert got.results == [IdResult("a", 5, BAD)] and got.source.num_rows == 0
