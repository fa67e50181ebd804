"""The delivery history cannot disagree with delivery state (issue 17): pull rounds (leases,
acks, nacks, leases run out) in processes SIGKILLed at random moments, two at a time on one
subscription, leave every state change with exactly its history rows, and no history row
for a change that did not commit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import deltabus
from deltabus.delivery import history
from deltabus.storage import open_engine
from tests.integration import _history_worker as worker

# Its test runs in a pytest process of its own beside the session's others (tests/background.py):
# about 15 s of processes started and killed.
OUT_OF_PROCESS = True

WORKER = Path(worker.__file__)
N = 300


def start(warehouse: str, subscription: str, seed: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WORKER), warehouse, subscription, str(seed)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_pull_rounds_leave_history_and_state_in_agreement(pub, sub, topic, warehouse) -> None:
    name = sub.subscription_path("local", "history-crash")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    published = pub.publish_batch(topic, [{"data": b"%d" % i} for i in range(N)])
    rng = random.Random(17)
    for run in range(4):
        procs = [start(warehouse, name, 100 * run + i) for i in range(2)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        time.sleep(rng.uniform(0.3, 1.5))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL, err[-3000:]

    engine = open_engine(warehouse, engine="delta-rs", create=False)
    snap = engine.snapshot("deliveries")
    uid = sub._sub(name).sub_uid
    state = snap.read(["message_id", "delivery_attempt", "lease_expires"], partition=uid)
    attempt_now = dict(zip(state["message_id"].to_pylist(), state["delivery_attempt"].to_pylist()))
    rows = history.read(snap, name)
    by_message: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for m, a, o in zip(rows["message_id"].to_pylist(), rows["attempt"].to_pylist(), rows["outcome"].to_pylist()):
        by_message[m].append((a, o))
    outcomes = Counter(rows["outcome"].to_pylist())
    assert outcomes["ack"] > 0 and outcomes["nack"] > 0 and outcomes["expired"] > 0, outcomes  # every kind happened
    acked = set(published) - set(attempt_now)
    assert acked and {m for m, events in by_message.items() if any(o == "ack" for _, o in events)} == acked
    for m in published:
        events = by_message.get(m, [])
        leases = Counter(a for a, o in events if o == "lease")
        last = max(leases, default=0)
        # One lease row per committed lease, attempts 1..n with none missing or doubled.
        assert sorted(leases) == list(range(1, last + 1)) and set(leases.values()) <= {1}, (m, events)
        ends = Counter(a for a, o in events if o in ("ack", "nack", "expired"))
        assert set(ends.values()) <= {1}, (m, events)  # an attempt ends once
        if m in acked:
            assert [a for a, o in events if o == "ack"] == [last], (m, events)  # acked on its last lease, once
            assert set(ends) == set(range(1, last + 1)), (m, events)  # every earlier attempt ended (nack or expiry)
        else:
            assert attempt_now[m] == last, (m, events)  # the row's attempt is its last recorded lease
            assert set(range(1, last)) <= set(ends) <= set(range(1, last + 1)), (m, events)
