"""The push job exporting one Delta export subscription in its own process, SIGKILLed at a
chosen point (test_delta_export_crash.py). It runs the job's own ``process`` on delta-rs (no
Spark: nothing is pushed) until the subscription has nothing left, unless killed first.

Usage: python _export_worker.py WAREHOUSE SUBSCRIPTION KILL_AT SEED
KILL_AT: none, or POINT:N with POINT one of KILL_POINTS, N the 1-based append it applies to:
- before-append: the batch is leased and its pending file written; nothing appended.
- after-append: the batch is appended (committed to the target); not acked.
- mid-append: a timer fires 0..30 ms into the append (inside delta-rs's write and commit,
  or just after it); random:S kills at a random time within S seconds of the start.
Exits 0 once the subscription's backlog is empty.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time

from deltabus import SubscriberClient, config
from deltabus.push import export_table, exporter
from deltabus.push.job import DeliveryJob

KILL_POINTS = ("before-append", "after-append", "mid-append", "random")
BATCH = 50  # messages per export batch: many batches, many kill points


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill_at: str, rng: random.Random) -> None:
    if kill_at == "none":
        return
    point, _, raw = kill_at.partition(":")
    if point not in KILL_POINTS:
        raise SystemExit(f"unknown kill point {point!r}")
    if point == "random":
        threading.Timer(rng.uniform(0.0, float(raw)), die).start()
        return
    nth = int(raw)
    calls = [0]
    append = export_table.append_once

    def append_then(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == nth:
            if point == "before-append":
                die()
            if point == "mid-append":
                threading.Timer(rng.uniform(0.0, 0.03), die).start()
        done = append(*args, **kwargs)
        if calls[0] == nth and point == "after-append":
            die()
        return done

    export_table.append_once = append_then  # type: ignore[assignment]


def main(warehouse: str, subscription: str, kill_at: str, seed: int) -> None:
    exporter.EXPORT_BATCH = BATCH
    arm(kill_at, random.Random(seed))
    job = DeliveryJob(None, config.Settings(warehouse=warehouse, engine="delta-rs", backlog_interval=0.0))  # type: ignore[arg-type]
    client = SubscriberClient(warehouse=warehouse)
    deadline = time.monotonic() + 60
    batch = time.time_ns() // 1_000_000  # above every earlier run's batch ids (the job skips a recorded one)
    while client.get_backlog(subscription).num_unacked_messages and time.monotonic() < deadline:
        job.process(None, batch)
        batch += 1
        time.sleep(0.05)
    job.close()
    if client.get_backlog(subscription).num_unacked_messages:
        raise SystemExit("the subscription still has messages after 60 s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
