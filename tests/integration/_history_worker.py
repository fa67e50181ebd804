"""Delivery rounds with acks, nacks and leases left to run out, in their own process, until it
is SIGKILLed (test_delivery_history_crash.py).

Usage: python _history_worker.py MODE WAREHOUSE SUBSCRIPTION SEED
MODE pull: each round pulls up to 20 messages with a 1 s lease, acks about half, nacks about a
quarter (modify_ack_deadline 0) and leaves the rest to run out.
MODE push: the push job's commit (``push.plan.execute``, no Spark, no HTTP): each round merges
the outcomes reported for the last round's leases (about half acked with 204, a quarter
failed with 503 or refused, the rest never answered; now and then an answer for an attempt
that is no longer current) and takes the next 20 leases of 1 s, in one MERGE.
Prints "ready" after its first round.
"""

from __future__ import annotations

import random
import sys
import time

from deltabus.delivery import operations as ops
from deltabus.registry import Registry
from deltabus.storage import open_engine

def push_rounds(engine, rec, rng: random.Random) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa

    from deltabus.push import plan

    empty = pa.table({"topic_uid": pa.array([], pa.string())})
    leased: list[tuple[str, int]] = []
    first = True
    while True:
        answered = []
        for m, a in leased:
            r = rng.random()
            if r < 0.5:
                answered.append((m, a, "ack", 204, ""))
            elif r < 0.65:
                answered.append((m, a, "nack", 503, ""))
            elif r < 0.75:
                answered.append((m, a, "error", 0, "connection refused"))
            elif r < 0.8:
                answered.append((m, a + 1, "ack", 204, ""))  # an answer for a delivery that is not current
        acks = [x for x in answered if x[2] == "ack"]
        nacks = [x for x in answered if x[2] != "ack"]

        def table(rows):  # type: ignore[no-untyped-def]
            return pa.table({
                "message_id": pa.array([x[0] for x in rows], pa.string()),
                "delivery_attempt": pa.array([x[1] for x in rows], pa.int32()),
                "outcome": pa.array([x[2] for x in rows], pa.string()),
                "status": pa.array([x[3] for x in rows], pa.int32()),
                "error": pa.array([x[4] for x in rows], pa.string()),
                "latency_seconds": pa.array([0.002] * len(rows), pa.float64()),
            })

        outcomes = {rec.sub_uid: (table(acks), table(nacks))} if answered else {}
        v = engine.version("messages")
        result = engine.transact("deliveries", lambda snap: plan.execute(
            engine, snap, [plan.SubPlan(rec, 20, lease_seconds=1.0)], outcomes, empty, v, v, now=time.time(), batch_txn=None),
            what="push round")
        leased = result.leases.get(rec.sub_uid, [])
        if first:
            print("ready", flush=True)
            first = False
        if not leased:
            time.sleep(0.05)


if __name__ == "__main__":
    mode, warehouse, subscription, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rng = random.Random(seed)
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    rec = Registry(engine, clock=time.time).subscription(subscription)
    if mode == "push":
        push_rounds(engine, rec, rng)
    first = True
    while True:
        leases = ops.pull(engine, rec, max_messages=20, lease_seconds=1.0, clock=time.time)
        acks, nacks = [], []
        for lease in leases:
            r = rng.random()
            (acks if r < 0.5 else nacks if r < 0.75 else []).append((lease.message_id, lease.delivery_attempt))
        if acks:
            ops.acknowledge(engine, rec, acks, clock=time.time)
        if nacks:
            ops.modify_deadline(engine, rec, nacks, 0, clock=time.time)
        if first:
            print("ready", flush=True)
            first = False
        if not leases:
            time.sleep(0.05)
