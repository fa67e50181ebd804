import json
import multiprocessing
import time
from collections import Counter

import pytest

from deltabus import SubscriberClient
from deltabus.delivery.fanout import PULL_CATCH_UP_MIN
from tests.conftest import ManualClock
from tests.integration._workers import pull_and_ack

WORKERS = 2
# A backlog past what one pull fans out (PULL_CATCH_UP_MIN): the pullers' first pulls each
# fan out part of it and lease from that part, concurrently (fanout.catch_up's partial path).
PAST_CATCH_UP = PULL_CATCH_UP_MIN + 5_000


@pytest.mark.parametrize("n, max_messages", [(5_000, 100), (PAST_CATCH_UP, 1_000)], ids=["backlog-5k", "backlog-past-catch-up"])
def test_processes_split_one_subscription(pub, sub, topic, warehouse, tmp_path, n, max_messages):
    s = sub.subscription_path("local", "shared")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=120)
    ids = []
    for start in range(0, n, 1000):
        ids += pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(start, start + 1000)])

    ctx = multiprocessing.get_context("spawn")  # delta-rs must not run in a forked child
    outs = [tmp_path / f"worker{i}.json" for i in range(WORKERS)]
    start = ctx.Barrier(WORKERS)
    procs = [ctx.Process(target=pull_and_ack, args=(warehouse, s, str(o), max_messages, start)) for o in outs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
        assert p.exitcode == 0

    results = [json.loads(o.read_text()) for o in outs]
    per_worker = [Counter(m for m, _, _ in r["received"]) for r in results]
    everything = sum(per_worker, Counter())
    # Every message was received, and exactly once: with a 120 s deadline that nobody let
    # expire, a second receipt could only come from a lease handed to two pullers at once.
    assert set(everything) == set(ids)
    assert max(everything.values()) == 1
    assert all(a == 1 for r in results for _, a, _ in r["received"])
    # How the work split (optimistic concurrency favours the last winner; not asserted).
    print("messages per process:", [len(c) for c in per_worker])

    # Every message was acked: even after every deadline has passed nothing comes back.
    later = SubscriberClient(warehouse=warehouse, clock=ManualClock(time.time() + 3600))
    assert later.pull(subscription=s, max_messages=100, return_immediately=True).received_messages == []
    b = later.get_backlog(s)
    assert b.num_unacked_messages == 0
