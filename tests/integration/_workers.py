"""Code run in separate OS processes by the concurrency tests (spawned, never forked)."""

from __future__ import annotations

import json
import os
import time


def pull_and_ack(warehouse: str, subscription: str, out_path: str, batch: int, start=None) -> None:
    from deltabus import SubscriberClient

    client = SubscriberClient(warehouse=warehouse)
    if start is not None:  # begin together, so that the pullers really contend
        start.wait(timeout=120)
    received = []
    empty = 0
    while empty < 5:
        resp = client.pull(subscription=subscription, max_messages=batch, return_immediately=True)
        got = resp.received_messages
        if not got:
            empty += 1
            time.sleep(0.2)
            continue
        empty = 0
        now = time.time()
        received.extend((r.message.message_id, r.delivery_attempt, now) for r in got)
        client.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in got])
    with open(out_path, "w") as f:
        json.dump({"pid": os.getpid(), "received": received}, f)
