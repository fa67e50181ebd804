"""One snapshot or seek call in its own process, SIGKILLed at a chosen point
(test_seek_crash.py).

Usage: python _seek_worker.py ACTION KILL_AT WAREHOUSE SUBSCRIPTION SNAPSHOT
ACTION: create (create_snapshot), delete (delete_snapshot), seek (seek to the snapshot),
or seek-time (seek to the epoch).
KILL_AT: none, or
- after-messages: create's first commit (the snapshot's messages) made; no registry row.
- after-row: delete's first commit (the registry row deleted) made; the messages stay.
- ready: print "ready" and then run the call, for the test to kill at a time of its choosing.
Prints "done" when the call returned.
"""

from __future__ import annotations

import os
import signal
import sys

from deltabus import SubscriberClient
from deltabus.snapshots import Snapshots


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill_at: str) -> None:
    create_row, delete_row = Snapshots.create, Snapshots._delete_row

    if kill_at == "after-messages":
        def create_then_die(self, rec, messages):  # type: ignore[no-untyped-def]
            engine = self._engine
            append = engine.append

            def append_then_die(table, data, **kw):  # type: ignore[no-untyped-def]
                done = append(table, data, **kw)
                die()
                return done

            engine.append = append_then_die
            return create_row(self, rec, messages)

        Snapshots.create = create_then_die  # type: ignore[method-assign]
    elif kill_at == "after-row":
        def delete_then_die(self, rec):  # type: ignore[no-untyped-def]
            done = delete_row(self, rec)
            die()
            return done

        Snapshots._delete_row = delete_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    action, kill_at, warehouse, subscription, snapshot = sys.argv[1:6]
    arm(kill_at)
    with SubscriberClient(warehouse=warehouse) as client:
        client.get_subscription(subscription=subscription)  # the warehouse opened: the kill then hits the call
        if kill_at == "ready":
            print("ready", flush=True)
        if action == "create":
            client.create_snapshot(name=snapshot, subscription=subscription)
        elif action == "delete":
            client.delete_snapshot(snapshot=snapshot)
        elif action == "seek":
            client.seek(subscription=subscription, snapshot=snapshot)
        elif action == "seek-time":
            client.seek(subscription=subscription, time=0)
        else:
            raise SystemExit(f"ACTION: create, delete, seek or seek-time, got {action!r}")
    print("done", flush=True)
