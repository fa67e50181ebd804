"""Ordering keys' throughput (issue 13), not a test: the same backlog with and without ordering.

    .venv/bin/python bench/ordering.py [--keys 1000] [--per-key 100] [--skip-push]

A topic gets KEYS x PER_KEY 1 KB messages, the keys interleaved (message i has key i % KEYS),
published in commits of 1,000. Then, each on a fresh warehouse with the same backlog:

- pull: one process pulls (max_messages 1,000) and acks until every message is acked, on a
  subscription with and one without ``enable_message_ordering``;
- push: ``jobs/deliver.py --until-idle`` (through ./spark-submit.sh, as bench/run.py's push
  section) delivers to the bench's acking endpoint, measured from the first request to the
  moment the subscription's deliveries partition is empty; with ordering one message per key
  is out at a time.

Prints one JSON object (messages per second of each run, and the ratios). Every warehouse
is made under one scratch directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import _deliver, _finish, _wait_drained, log  # noqa: E402


def _backlog(wh: str, keys: int, per_key: int, ordered: bool, push_url: str | None) -> tuple[Any, Any, str, str]:
    from deltabus import PublisherClient, SubscriberClient

    pub, sub = PublisherClient(warehouse=wh), SubscriberClient(warehouse=wh, allow_http=True)
    topic = pub.topic_path("bench", "ordering")
    name = sub.subscription_path("bench", "ordering")
    pub.create_topic(name=topic)
    request: dict[str, Any] = {"name": name, "topic": topic, "enable_message_ordering": ordered, "ack_deadline_seconds": 600}
    if push_url is not None:
        request["push_config"] = {"push_endpoint": push_url}
        request["ack_deadline_seconds"] = 60
    sub.create_subscription(request=request)
    n = keys * per_key
    rows = [{"data": b"x" * 1024, "ordering_key": f"key-{i % keys:05d}"} for i in range(n)]
    for start in range(0, n, 1000):
        pub.publish_batch(topic, rows[start:start + 1000])  # one commit each: order within by id
    return pub, sub, topic, name


def pull_rate(scratch: Path, keys: int, per_key: int, ordered: bool) -> float:
    wh = tempfile.mkdtemp(prefix="pull-", dir=scratch)
    pub, sub, _, name = _backlog(wh, keys, per_key, ordered, None)
    n, acked, idle = keys * per_key, 0, 0
    t0 = time.perf_counter()
    while acked < n and idle < 50:
        got = sub.pull(subscription=name, max_messages=1000, return_immediately=True).received_messages
        if not got:
            idle += 1
            continue
        idle = 0
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
        acked += len(got)
    rate = acked / (time.perf_counter() - t0)
    pub.stop()
    sub.close()
    if acked < n:
        raise RuntimeError(f"pull ({'ordered' if ordered else 'plain'}): only {acked} of {n} acked")
    log(f"pull+ack {'with' if ordered else 'without'} ordering: {rate:.0f} msg/s")
    return rate


def push_rate(scratch: Path, keys: int, per_key: int, ordered: bool) -> dict[str, float]:
    from bench.endpoint import BenchEndpoint

    wh = tempfile.mkdtemp(prefix="push-", dir=scratch)
    with BenchEndpoint() as ep:
        pub, sub, _, name = _backlog(wh, keys, per_key, ordered, ep.url)
        uid = sub._registry.subscription(name).sub_uid
        version = pub.engine.version("messages")
        proc = _deliver(wh, trigger=0.2)
        done = _wait_drained(wh, uid, proc, version, timeout=1800)
        stats = ep.stats()
        _finish(proc)
        pub.stop()
        sub.close()
    n = keys * per_key
    rate = n / (done - stats["first"])
    log(f"push {'with' if ordered else 'without'} ordering: {rate:.0f} msg/s ({stats['count']} requests)")
    return {"msgs_per_s": round(rate, 1), "requests": stats["count"], "seconds": round(done - stats["first"], 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--per-key", type=int, default=100)
    p.add_argument("--skip-push", action="store_true", help="pull only (push starts a Spark job)")
    args = p.parse_args()
    out: dict[str, Any] = {"keys": args.keys, "per_key": args.per_key, "messages": args.keys * args.per_key}
    with tempfile.TemporaryDirectory(prefix="deltabus-bench-ordering-") as tmp:
        scratch = Path(tmp)
        out["pull_plain_msgs_per_s"] = round(pull_rate(scratch, args.keys, args.per_key, False), 1)
        out["pull_ordered_msgs_per_s"] = round(pull_rate(scratch, args.keys, args.per_key, True), 1)
        out["pull_ratio"] = round(out["pull_ordered_msgs_per_s"] / out["pull_plain_msgs_per_s"], 3)
        if not args.skip_push:
            out["push_plain"] = push_rate(scratch, args.keys, args.per_key, False)
            out["push_ordered"] = push_rate(scratch, args.keys, args.per_key, True)
            out["push_ratio"] = round(out["push_ordered"]["msgs_per_s"] / out["push_plain"]["msgs_per_s"], 3)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
