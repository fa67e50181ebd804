"""The delivery history cannot disagree with delivery state (issue 17): pull rounds (leases,
acks, nacks, leases run out; two processes at a time on one subscription) and the push job's
commits (outcomes and next leases in one MERGE), in processes SIGKILLed at random moments,
leave every state change with exactly its history rows, and no history row for a change that
did not commit."""

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
# about 20 s of processes started and killed.
OUT_OF_PROCESS = True

WORKER = Path(worker.__file__)
N = 300


def start(mode: str, warehouse: str, subscription: str, seed: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WORKER), mode, warehouse, subscription, str(seed)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill_rounds(mode: str, warehouse: str, name: str, runs: int, at_once: int, seed: int) -> None:
    """`runs` times: `at_once` workers started, killed together after a random while."""
    rng = random.Random(seed)
    for run in range(runs):
        procs = [start(mode, warehouse, name, 100 * run + i) for i in range(at_once)]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
        time.sleep(rng.uniform(0.3, 1.5))
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL, err[-3000:]


def check_agreement(warehouse: str, name: str, uid: str, published: list[str], ok: str, failed: tuple[str, ...]) -> Counter:
    """Every state change has exactly its history rows (`ok`: the outcome that acks; `failed`:
    those that end an attempt without acking); returns the count of each outcome."""
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    snap = engine.snapshot("deliveries")
    state = snap.read(["message_id", "delivery_attempt"], partition=uid)
    attempt_now = dict(zip(state["message_id"].to_pylist(), state["delivery_attempt"].to_pylist()))
    rows = history.read(snap, name)
    by_message: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for m, a, o in zip(rows["message_id"].to_pylist(), rows["attempt"].to_pylist(), rows["outcome"].to_pylist()):
        by_message[m].append((a, o))
    acked = set(published) - set(attempt_now)
    assert acked and {m for m, events in by_message.items() if any(o == ok for _, o in events)} == acked
    for m in published:
        events = by_message.get(m, [])
        leases = Counter(a for a, o in events if o == "lease")
        last = max(leases, default=0)
        # One lease row per committed lease, attempts 1..n with none missing or doubled.
        assert sorted(leases) == list(range(1, last + 1)) and set(leases.values()) <= {1}, (m, events)
        ends = Counter(a for a, o in events if o in (ok, *failed))
        assert set(ends.values()) <= {1}, (m, events)  # an attempt ends once
        if m in acked:
            assert [a for a, o in events if o == ok] == [last], (m, events)  # acked on its last lease, once
            assert set(ends) == set(range(1, last + 1)), (m, events)  # every earlier attempt ended
        else:
            assert attempt_now[m] == last, (m, events)  # the row's attempt is its last recorded lease
            assert set(range(1, last)) <= set(ends) <= set(range(1, last + 1)), (m, events)
    return Counter(rows["outcome"].to_pylist())


def test_killed_pull_rounds_leave_history_and_state_in_agreement(pub, sub, topic, warehouse) -> None:
    name = sub.subscription_path("local", "history-crash")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    published = pub.publish_batch(topic, [{"data": b"%d" % i} for i in range(N)])
    kill_rounds("pull", warehouse, name, runs=4, at_once=2, seed=17)
    outcomes = check_agreement(warehouse, name, sub._sub(name).sub_uid, published, "ack", ("nack", "expired"))
    assert outcomes["ack"] > 0 and outcomes["nack"] > 0 and outcomes["expired"] > 0, outcomes


def test_killed_push_commits_leave_history_and_state_in_agreement(pub, psub, topic, warehouse) -> None:
    """The push job's commit (plan.execute: the reported outcomes and the next leases in one
    MERGE) in a process killed at random moments, with answers for attempts no longer current
    among the outcomes: every push_ok is an ack that applied, each attempt ends once, and the
    stale answers are recorded as such."""
    name = psub.subscription_path("local", "history-push-crash")
    psub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    published = pub.publish_batch(topic, [{"data": b"%d" % i} for i in range(N)])
    kill_rounds("push", warehouse, name, runs=3, at_once=1, seed=23)
    outcomes = check_agreement(warehouse, name, psub._sub(name).sub_uid, published, "push_ok", ("push_failed", "expired"))
    assert outcomes["push_failed"] > 0 and outcomes["expired"] > 0 and outcomes["stale"] > 0, outcomes
