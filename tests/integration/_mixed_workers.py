"""delta-rs publishers and pullers run in their own OS processes (spawned, never forked: the
Rust runtime panics after a fork) by test_mixed_engines.py, beside a deliver job on
delta-spark. Each writes what it did to a JSON file the test checks.

A puller's log: ``grants`` [message_id, delivery_attempt, t_call_start, t_call_end] for every
message a pull returned (the lease ran from some moment in that call for the subscription's
ack deadline), ``acks`` and ``nacks`` [message_id, delivery_attempt, t_call_start, t_call_end]
of the calls that settled them.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def _open(warehouse: str) -> Any:
    """A client pinned to the embedded engine (not left to DELTABUS_ENGINE)."""
    from deltabus import SubscriberClient
    from deltabus.storage import open_engine

    return SubscriberClient(engine=open_engine(warehouse, engine="delta-rs", create=False))


def publish(warehouse: str, topic: str, out_path: str, batches: int, size: int, pause: float, start: Any) -> None:
    """Publish `batches` batches of `size` (every third through ``publish`` futures, the
    batcher's path; the others one ``publish_batch`` commit each), `pause` s apart."""
    from deltabus import PublisherClient
    from deltabus.storage import open_engine

    client = PublisherClient(engine=open_engine(warehouse, engine="delta-rs", create=False))
    start.wait(timeout=600)
    ids: list[str] = []
    tag = os.getpid()
    for b in range(batches):
        datas = [f"{tag}-{b}-{i}".encode() for i in range(size)]
        if b % 3 == 2:
            futures = [client.publish(topic, d) for d in datas]
            ids += [f.result(timeout=60) for f in futures]
        else:
            ids += client.publish_batch(topic, [{"data": d} for d in datas])
        time.sleep(pause)
    client.stop()
    with open(out_path, "w") as f:
        json.dump({"pid": os.getpid(), "ids": ids}, f)


def pull(
    warehouse: str, subscription: str, out_path: str, batch: int, nack_every: int, pause: float, start: Any, done: Any, limit: float
) -> None:
    """Pull and ack until the publishers are `done` and three pulls in a row found nothing
    (or `limit` seconds pass); every `nack_every`-th message received is nacked instead, and
    `pause` s pass after each pull that got messages (leaving room to a slower competitor)."""
    client = _open(warehouse)
    start.wait(timeout=600)
    grants: list[list[Any]] = []
    acks: list[list[Any]] = []
    nacks: list[list[Any]] = []
    empty, seen = 0, 0
    give_up = time.time() + limit
    while time.time() < give_up:
        t0 = time.time()
        got = client.pull(subscription=subscription, max_messages=batch, return_immediately=True).received_messages
        t1 = time.time()
        if not got:
            if done.is_set():
                empty += 1
                if empty >= 3:
                    break
            time.sleep(0.1)
            continue
        empty = 0
        grants += [[r.message.message_id, r.delivery_attempt, t0, t1] for r in got]
        to_ack, to_nack = [], []
        for r in got:
            seen += 1
            (to_nack if nack_every and seen % nack_every == 0 else to_ack).append(r)
        for settle, chosen, log in ((True, to_ack, acks), (False, to_nack, nacks)):
            if not chosen:
                continue
            a0 = time.time()
            if settle:
                client.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in chosen])
            else:
                client.modify_ack_deadline(subscription=subscription, ack_ids=[r.ack_id for r in chosen], ack_deadline_seconds=0)
            a1 = time.time()
            log += [[r.message.message_id, r.delivery_attempt, a0, a1] for r in chosen]
        time.sleep(pause)
    client.close()
    with open(out_path, "w") as f:
        json.dump({"pid": os.getpid(), "grants": grants, "acks": acks, "nacks": nacks}, f)
