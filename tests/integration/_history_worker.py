"""Pull rounds with acks, nacks and leases left to run out, in their own process, until it is
SIGKILLed (test_delivery_history_crash.py).

Usage: python _history_worker.py WAREHOUSE SUBSCRIPTION SEED
Each round pulls up to 20 messages with a 1 s lease, acks about half, nacks about a quarter
(modify_ack_deadline 0) and leaves the rest to run out; prints "ready" after its first round.
"""

from __future__ import annotations

import random
import sys
import time

from deltabus.delivery import operations as ops
from deltabus.registry import Registry
from deltabus.storage import open_engine

if __name__ == "__main__":
    warehouse, subscription, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    rec = Registry(engine, clock=time.time).subscription(subscription)
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
