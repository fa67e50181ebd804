"""The push job's per-subscription book: outcomes folded, held for a commit, exclusions (no I/O)."""

import logging

import pyarrow as pa

from deltabus.push.ledger import Collected
from deltabus.push.outcome import ACK, ERROR, EXPIRED, NACK, TIMEOUT
from deltabus.push.outcome_ledger import Folded, OutcomeLedger, failure_reasons, round_of
from deltabus.push.wire import RESULT_SCHEMA
from tests.conftest import ManualClock


def results(rows) -> pa.Table:
    """RESULT_SCHEMA rows from (sub_uid, message_id, status, outcome, error)."""
    return pa.Table.from_pylist([
        dict(sub_uid=u, message_id=m, delivery_attempt=1, status=s, outcome=o, latency_seconds=0.01, error=e, assignment=0)
        for u, m, s, o, e in rows
    ], schema=RESULT_SCHEMA)


def book(clock=None) -> OutcomeLedger:
    return OutcomeLedger(lambda: {}, clock=clock or ManualClock(1000.0), rand=lambda: 0.5)


def test_a_round_counts_every_non_ack_as_a_nack_and_names_the_reasons():
    rows = results([("a", "1", 204, ACK, ""), ("a", "2", 503, NACK, ""), ("a", "3", 0, TIMEOUT, ""),
                    ("a", "4", 0, ERROR, "connection refused"), ("a", "5", 0, EXPIRED, ""), ("a", "6", 503, NACK, "")])
    r, held = round_of(rows)
    assert (r.acks, r.nacks, r.expired) == (1, 5, 1)
    assert held.acks["message_id"].to_pylist() == ["1"]
    assert sorted(held.nacks["message_id"].to_pylist()) == ["2", "3", "4", "5", "6"]
    assert dict(failure_reasons(rows.filter(pa.array([o != ACK for o in rows["outcome"].to_pylist()])))) == {
        "http 503": 2, "timeout": 1, "connection refused": 1, "expired": 1}
    assert r.last_status == "http 503"


def test_outcomes_are_held_across_deferred_batches_and_handed_over_once():
    b = book()
    b.pushed("a", ["1", "2", "3"], at=1000.0)
    b.pushed("gone", ["9"], at=1000.0)
    assert b.fold(None) == Folded(0, 0)
    assert b.fold(Collected(results([("a", "1", 204, ACK, ""), ("gone", "9", 204, ACK, "")]))) == Folded(2, 0)
    assert b.fold(Collected(results([("a", "2", 503, NACK, "")]))) == Folded(0, 1)
    assert b.state("a").in_flight == {"3"} and (b.state("a").acked, b.state("a").nacked) == (1, 1)
    merging = b.take_held(["a"])  # "gone" was deleted meanwhile: nothing to merge its ack into
    assert set(merging) == {"a"}
    assert merging["a"].acks["message_id"].to_pylist() == ["1"] and merging["a"].nacks["message_id"].to_pylist() == ["2"]
    assert b.exclusions("a", merging) == frozenset({"1", "2", "3"})
    assert b.take_held(["a"]) == {}  # handed over once


def test_lost_pushes_leave_the_in_flight_set_and_are_logged(caplog):
    b = book()
    b.pushed("a", ["1", "2"], at=1000.0)
    assert b.state("a").delivered == 2 and b.state("a").last_push == 1000.0
    with caplog.at_level(logging.ERROR, logger="deltabus"):
        assert b.fold(Collected(RESULT_SCHEMA.empty_table(), lost=[("a", "1")])) == Folded(0, 0)
    assert b.state("a").in_flight == {"2"}
    assert "1 pushes got no outcome" in caplog.text


def test_room_is_the_window_capped_by_the_budget_and_zero_in_backoff():
    clock = ManualClock(1000.0)
    b = book(clock)
    window = b.state("a").window.room(0)
    assert window > 0
    assert b.room("a", clock(), budget=10_000) == window
    assert b.room("a", clock(), budget=1) == 1
    assert b.room("a", clock(), budget=0) == 0
    b.pushed("a", [str(i) for i in range(5)], at=clock())
    b.fold(Collected(results([("a", str(i), 503, NACK, "") for i in range(5)])))
    assert b.state("a").backoff.active
    assert b.room("a", clock(), budget=10_000) == 0


def test_restore_takes_the_push_figures_of_existing_subscriptions_only():
    b = book()
    rows = [dict(subscription="s", delivered=7, acked=5, nacked=2, push_window=4, backoff_seconds=0.0, backoff_until=None,
                 last_status="http 204", last_error="http 503"),
            dict(subscription="deleted", delivered=1, acked=1, nacked=0, push_window=3, backoff_seconds=0.0),
            dict(subscription="pull", delivered=None)]
    b.restore(rows, {"s": "uid-s", "pull": "uid-pull"})
    assert "uid-s" in b and "uid-pull" not in b
    st = b.state("uid-s")
    assert (st.delivered, st.acked, st.nacked, st.last_status, st.last_error) == (7, 5, 2, "http 204", "http 503")
