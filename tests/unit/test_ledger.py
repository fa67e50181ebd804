"""The driver's ledger of pushes, driven with a fake clock (no HTTP, no Spark)."""

import datetime as dt

import pyarrow as pa

from deltabus.push.ledger import PushLedger
from deltabus.push.sender import REQUEST_SCHEMA
from deltabus.push.wire import RESULT_SCHEMA

NOW = dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def requests(sub: str, ids, timeout: float = 10.0) -> pa.Table:
    rows = [dict(sub_uid=sub, subscription=f"projects/p/subscriptions/{sub}", message_id=str(i), delivery_attempt=1,
                 endpoint="http://127.0.0.1:9/", token=None, no_wrapper=False, write_metadata=False, timeout_seconds=timeout,
                 data=b"x", attributes=[], ordering_key="", publish_time=NOW) for i in ids]
    return pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)


def results(work: pa.Table, outcome: str = "ack") -> pa.Table:
    n = work.num_rows
    return pa.table({
        "sub_uid": work["sub_uid"], "message_id": work["message_id"], "delivery_attempt": work["delivery_attempt"],
        "status": pa.array([204] * n, pa.int32()), "outcome": pa.array([outcome] * n), "latency_seconds": pa.array([0.01] * n),
        "error": pa.array([""] * n), "assignment": work["assignment"],
    }, schema=RESULT_SCHEMA)


def test_hand_out_respects_each_subscriptions_cap_and_the_limit():
    d = PushLedger(clock=Clock())
    d.submit("a", requests("a", range(100)))
    d.submit("b", requests("b", range(100, 110)))
    assert d.queued() == 110
    work = d.hand_out("w1", {"a": 30}, per_sub=50, limit=1000)
    counts = {u: work["sub_uid"].to_pylist().count(u) for u in ("a", "b")}
    assert counts == {"a": 20, "b": 10}
    assert len(set(work["assignment"].to_pylist())) == 1
    assert d.queued() == 80 and d.outstanding() == 110
    assert d.hand_out("w1", {"a": 50, "b": 50}, per_sub=50, limit=1000) is None  # full on both
    assert d.has_queued()


def test_settled_outcomes_are_collected_once_and_clear_the_ledger():
    d = PushLedger(clock=Clock())
    d.submit("a", requests("a", range(10)))
    work = d.hand_out("w1", {}, per_sub=100, limit=100)
    d.settle(results(work.slice(0, 4)))
    got = d.collect()
    assert got.outcomes["message_id"].to_pylist() == ["0", "1", "2", "3"] and got.lost == []
    assert d.outstanding() == 6
    d.settle(results(work.slice(4)))
    assert d.collect().outcomes.num_rows == 6 and d.outstanding() == 0
    assert d.collect().outcomes.num_rows == 0


def test_unreported_work_is_lost_after_its_deadline_plus_grace():
    clock = Clock()
    d = PushLedger(grace=30.0, clock=clock)
    d.submit("a", requests("a", range(3), timeout=10.0))
    work = d.hand_out("w1", {}, per_sub=100, limit=100)
    d.settle(results(work.slice(0, 1)))
    clock.t += 39.0
    assert d.collect().lost == []
    clock.t += 1.0
    assert sorted(d.collect().lost) == [("a", "1"), ("a", "2")]
    assert d.outstanding() == 0
    # A late report still comes through: the push happened and its ack saves a redelivery.
    d.settle(results(work.slice(1)))
    assert d.collect().outcomes.num_rows == 2


def test_queued_work_is_lost_once_its_lease_has_expired():
    clock = Clock()
    d = PushLedger(clock=clock)
    d.submit("a", requests("a", range(2), timeout=10.0))
    clock.t += 10.0
    assert sorted(d.collect().lost) == [("a", "0"), ("a", "1")]
    assert d.queued() == 0 and d.hand_out("w1", {}, per_sub=10, limit=10) is None


def test_a_gone_worker_loses_only_what_it_held():
    d = PushLedger(clock=Clock())
    d.submit("a", requests("a", range(4)))
    d.hand_out("w1", {}, per_sub=2, limit=100)
    d.hand_out("w2", {}, per_sub=2, limit=100)
    assert d.workers_gone({"w1"}) == 2
    assert len(d.collect().lost) == 2 and d.outstanding() == 2
    assert d.workers_gone() == 2


def test_drop_queued_forgets_only_what_no_worker_has():
    d = PushLedger(clock=Clock())
    d.submit("a", requests("a", range(5)))
    d.hand_out("w1", {}, per_sub=2, limit=100)
    assert d.drop_queued() == 3
    assert d.outstanding() == 2 and len(d.collect().lost) == 3


def test_large_queues_are_split_across_hand_outs_in_order():
    d = PushLedger(clock=Clock())
    d.submit("a", requests("a", range(5)))
    d.submit("a", requests("a", range(5, 8)))
    first = d.hand_out("w1", {}, per_sub=6, limit=100)
    second = d.hand_out("w2", {}, per_sub=6, limit=100)
    assert first["message_id"].to_pylist() == [str(i) for i in range(6)]
    assert second["message_id"].to_pylist() == ["6", "7"]
    assert first["assignment"][0] != second["assignment"][0]


def test_a_request_whose_lease_outlives_its_deadline_is_not_given_up_before_the_lease_ends():
    # The push job adds its commit time to a lease (policy/lease_start.py): a worker may
    # still send it until the lease ends, so the ledger does not call it lost before then.
    clock, wall = Clock(), Clock()
    d = PushLedger(clock=clock, wall=wall, grace=0.0)
    table = requests("a", range(2), timeout=10.0)
    ends = dt.datetime.fromtimestamp(wall.t + 25.0, tz=dt.timezone.utc)
    table = table.set_column(table.schema.get_field_index("lease_expires"), "lease_expires",
                             pa.array([ends] * 2, REQUEST_SCHEMA.field("lease_expires").type))
    d.submit("a", table)
    clock.t += 11.0
    assert d.collect().lost == [] and d.queued() == 2  # past the ack deadline, inside the lease
    clock.t += 15.0
    assert len(d.collect().lost) == 2  # the lease is over: not sent any more
    d.submit("a", table.slice(0, 1))
    work = d.hand_out("w1", {}, per_sub=10, limit=10)
    assert work is not None
    clock.t += 0.5
    assert d.collect().lost == []


def test_settled_within_is_the_last_give_up_time_of_what_is_held_each_by_its_own_lease():
    # The push job's drain waits this long: a lease granted with a long allowance (a slow
    # commit earlier) is waited for even when today's allowance is short.
    clock, wall = Clock(), Clock()
    d = PushLedger(clock=clock, wall=wall, grace=0.0)
    assert d.settled_within() == 0.0
    table = requests("a", range(2), timeout=10.0)
    ends = dt.datetime.fromtimestamp(wall.t + 40.0, tz=dt.timezone.utc)
    long_lease = table.set_column(table.schema.get_field_index("lease_expires"), "lease_expires",
                                  pa.array([ends] * 2, REQUEST_SCHEMA.field("lease_expires").type))
    d.submit("a", requests("a", [7], timeout=10.0))
    assert d.settled_within() == 10.0
    d.submit("b", long_lease.set_column(0, "sub_uid", pa.array(["b", "b"])))
    assert d.settled_within() == 40.0
    work = d.hand_out("w1", {}, per_sub=10, limit=10)
    assert work is not None and work.num_rows == 3
    clock.t += 5.0
    assert d.settled_within() == 35.0  # handed out: the assignment keeps each lease's end
    d.settle(results(work))
    assert d.settled_within() == 0.0


def test_outstanding_bytes_follow_submit_settle_loss_and_drop():
    from deltabus.push.ledger import message_sizes

    clock = Clock()
    d = PushLedger(clock=clock)
    big = requests("a", range(4)).set_column(REQUEST_SCHEMA.get_field_index("data"), REQUEST_SCHEMA.field("data"),
                                              pa.array([b"x" * 100] * 4, pa.binary()))
    big = big.set_column(REQUEST_SCHEMA.get_field_index("attributes"), REQUEST_SCHEMA.field("attributes"),
                         pa.array([[("k", "vvvv")], [], None, [("k", "1"), ("j", "22")]], REQUEST_SCHEMA.field("attributes").type))
    assert message_sizes(big) == [104, 100, 100, 103] and message_sizes(big.slice(3)) == [103]
    d.submit("a", big)
    d.submit("b", requests("b", range(10, 13)))  # 3 x 1 byte
    assert d.outstanding_bytes() == 410 and d.peak_bytes == 410
    work = d.hand_out("w1", {}, per_sub=1, limit=1000)  # one of each: still outstanding with the worker
    assert d.outstanding_bytes() == 410
    d.settle(results(work))
    assert d.outstanding_bytes() == 410 - 104 - 1
    clock.t += 60  # past every lease: the rest given up on
    d.collect()
    assert d.outstanding_bytes() == 0 and d.peak_bytes == 410
    d.submit("a", big)
    assert d.drop_queued() == 4 and d.outstanding_bytes() == 407  # lost: freed at the next collect
    d.collect()
    assert d.outstanding_bytes() == 0
