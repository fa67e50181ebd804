"""The push queue's byte cap is shared by the job's push subscriptions, served in order
(push.plan.execute): once one's next message does not fit, those after it get no bytes and
it is served first next time (PlanResult.bytes_blocked, DeliveryJob._bytes_first). Without
that, a subscription earlier in the order took every byte freed, batch after batch, and a
later one never leased. Real Delta tables in a temp dir, the job's commit without Spark."""

from __future__ import annotations

import time

import pyarrow as pa

from deltabus.push import plan
from deltabus.registry import Registry
from deltabus.storage import open_engine

EMPTY = pa.table({"topic_uid": pa.array([], pa.string())})


def _acks(leases: list[tuple[str, int]]) -> tuple[pa.Table, pa.Table]:
    def table(rows: list[tuple[str, int]]) -> pa.Table:
        n = len(rows)
        return pa.table({
            "message_id": pa.array([m for m, _ in rows], pa.string()),
            "delivery_attempt": pa.array([a for _, a in rows], pa.int32()),
            "outcome": pa.array(["ack"] * n, pa.string()), "status": pa.array([204] * n, pa.int32()),
            "error": pa.array([""] * n, pa.string()), "latency_seconds": pa.array([0.01] * n, pa.float64()),
        })
    return table(leases), table([])


def test_a_subscription_later_in_the_order_is_not_starved_of_bytes(pub, sub, topic, warehouse) -> None:
    names = [sub.subscription_path("local", n) for n in ("aaa-first", "bbb-second")]
    for name in names:
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": "https://127.0.0.1:9/push"})
    pub.publish_batch(topic, [{"data": b"x" * 1000} for _ in range(30)])
    engine = open_engine(warehouse)
    records = Registry(engine, clock=time.time).subscriptions()
    a, b = (records[n] for n in names)
    got = {a.sub_uid: 0, b.sub_uid: 0}
    held: dict[str, tuple[pa.Table, pa.Table]] = {}
    first: str | None = None
    for _ in range(12):
        # What the job does: the subscription blocked by bytes last time goes first. The queue
        # holds about one message of another push, so 1,500 bytes are free: one more message.
        order = [r for r in (a, b) if r.sub_uid == first] + [r for r in (a, b) if r.sub_uid != first]
        v = engine.version("messages")
        result = engine.transact("deliveries", lambda snap: plan.execute(
            engine, snap, [plan.SubPlan(r, 10, lease_seconds=60.0) for r in order], held, EMPTY, v, v,
            now=time.time(), batch_txn=None, max_bytes=1500, oversize_ok=False), what="push batch")
        first = result.bytes_blocked
        held = {}
        for uid, leases in result.leases.items():
            got[uid] += len(leases)
            held[uid] = _acks(leases)  # settled by the next batch
        assert sum(len(x) for x in result.leases.values()) <= 1  # the cap: one message of 1,000 bytes per batch
    assert got[a.sub_uid] >= 5 and got[b.sub_uid] >= 5, got
