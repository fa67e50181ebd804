"""One dead-lettering decision run in its own process, SIGKILLed at a chosen point
(test_dead_letter_crash.py). The subscription's message has had its max_delivery_attempts
deliveries; this run's pull (mode "pull") or push batch (mode "push", the push job's own
``process`` on delta-rs, no Spark: nothing is pushed once the message is given up) marks it,
copies it to the dead-letter topic and drops it, unless killed first.

Usage: python _dead_letter_worker.py MODE KILL_AT WAREHOUSE:SUBSCRIPTION...
KILL_AT: none, or one of KILL_POINTS:
- after-mark: the decision MERGE (commit 1, the marks) committed; nothing copied.
- after-copy: the copy appended to the dead-letter topic (commit 2); the marked rows not dropped.
- after-drop: the move finished (commit 3).
Prints one JSON line per warehouse: {"received": [message ids pulled]} (pull) or {} (push).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from deltabus import SubscriberClient, config
from deltabus.delivery.dead_letter import DeadLetterMover
from deltabus.push.job import DeliveryJob
from deltabus.storage.keyed_steps import MarkedMove

KILL_POINTS = ("after-mark", "after-copy", "after-drop")


def arm(kill_at: str) -> None:
    """Wrap the move's steps so the process kills itself at `kill_at`."""

    def die() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    finish, copy = DeadLetterMover.finish, MarkedMove.copy

    def finish_then(self: DeadLetterMover, engine, key):  # type: ignore[no-untyped-def]
        if kill_at == "after-mark":
            die()
        finish(self, engine, key)
        if kill_at == "after-drop":
            die()

    def copy_then(self: MarkedMove, engine, key):  # type: ignore[no-untyped-def]
        done = copy(self, engine, key)
        if kill_at == "after-copy":
            die()
        return done

    DeadLetterMover.finish = finish_then  # type: ignore[method-assign]
    MarkedMove.copy = copy_then  # type: ignore[method-assign]


def run(mode: str, warehouse: str, subscription: str) -> dict[str, object]:
    if mode == "pull":
        with SubscriberClient(warehouse=warehouse) as client:
            got = client.pull(subscription=subscription, max_messages=10, return_immediately=True).received_messages
            return {"received": [r.message.message_id for r in got]}
    settings = config.Settings(warehouse=warehouse, allow_http=True, engine="delta-rs", backlog_interval=3600.0)
    job = DeliveryJob(None, settings)  # type: ignore[arg-type]  # no push is made: no Spark needed
    try:
        # Batches until the message has left the subscription (the push backoff the first
        # job left in the backlog table may hold the first few).
        for batch in range(10_000, 10_100):
            job.process(None, batch)
            with SubscriberClient(warehouse=warehouse) as client:
                if client.get_backlog(subscription).num_unacked_messages == 0:
                    break
            time.sleep(0.1)
    finally:
        job.close()
    return {}


if __name__ == "__main__":
    mode_arg, kill_arg, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    if kill_arg != "none":
        if kill_arg not in KILL_POINTS:
            raise SystemExit(f"KILL_AT: must be none or one of {', '.join(KILL_POINTS)}, got {kill_arg!r}")
        arm(kill_arg)
    for target in targets:
        wh, sub = target.rsplit(":", 1)
        print(json.dumps(run(mode_arg, wh, sub)), flush=True)
