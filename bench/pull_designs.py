"""Pull + ack by 1, 2 and 4 processes: on one subscription, and with each process on a
subscription of its own (not a test).

    .venv/bin/python bench/pull_designs.py [--messages N] [--runs R]

Issue 18 asks to measure sharding a subscription's deliveries before building it. A
subscription of its own per puller is sharding at its best: each process commits to a
partition of its own of the one ``deliveries`` table (what shards would give), with no
conflicts and no stealing. The total is the same in both layouts: N messages on one
subscription, or N / P on each of P subscriptions (published once to one topic, which then
holds N / P messages: short runs showed a smaller per-message cost there, so compare runs of
40,000 or more). For each
run it prints one JSON line: msg/s, the pullers' CPU per acked message and busy cores (their
``getrusage``), and the commit conflicts they logged. README (Benchmarks, the pull bullet)
has the figures of 2026-11-28.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MAX_MESSAGES = 1000  # per pull, as bench/run.py's pull section


class _Conflicts(logging.Handler):
    """Counts the storage layer's commit-conflict log lines (each one a pull or ack rerun)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "commit conflict" in record.getMessage():
            self.n += 1


def _puller(wh: str, name: str, stop_at: int, counter: Any, ready: Any, go: Any, out: Any) -> None:  # child process
    from deltabus import SubscriberClient
    from deltabus.storage import open_engine

    conflicts = _Conflicts()
    logger = logging.getLogger("deltabus.storage.delta_rs")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(conflicts)
    sub = SubscriberClient(engine=open_engine(wh, engine="delta-rs", create=False))
    ready.release()
    go.wait()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    acked = idle = 0
    while counter.value < stop_at and idle < 20:
        got = sub.pull(subscription=name, max_messages=MAX_MESSAGES, return_immediately=True).received_messages
        if not got:
            idle += 1
            time.sleep(0.02)
            continue
        idle = 0
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
        with counter.get_lock():
            counter.value += len(got)
        acked += len(got)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.put({"acked": acked, "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "conflicts": conflicts.n})


def run_once(layout: str, procs: int, messages: int, scratch: Path) -> dict[str, Any]:
    from bench.run import _clients, _publish

    ctx = multiprocessing.get_context("spawn")  # delta-rs must not run in a forked child
    wh = tempfile.mkdtemp(prefix="pull-designs-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "pull")
    pub.create_topic(name=topic)
    subs = procs if layout == "own" else 1
    names = [sub.subscription_path("bench", f"pull-{i}") for i in range(subs)]
    for name in names:
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
    each = messages // subs
    _publish(pub, topic, each)
    counters = [ctx.Value("q", 0) for _ in names]
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_puller, args=(wh, names[i % subs], each, counters[i % subs], ready, go, out))
               for i in range(procs)]
    for w in workers:
        w.start()
    for _ in workers:
        if not ready.acquire(timeout=120):
            for w in workers:
                w.terminate()
            raise RuntimeError("a puller did not start within 120 s")
    t0 = time.perf_counter()
    go.set()
    reports = [out.get(timeout=600) for _ in workers]
    elapsed = time.perf_counter() - t0
    for w in workers:
        w.join(30)
    acked = sum(r["acked"] for r in reports)
    cpu = sum(r["cpu"] for r in reports)
    return {"layout": "a subscription per process" if layout == "own" else "one subscription", "processes": procs,
            "acked": acked, "msgs_per_s": round(acked / elapsed), "cpu_us_per_msg": round(cpu / max(1, acked) * 1e6, 1),
            "busy_cores": round(cpu / elapsed, 2), "conflicts": sum(r["conflicts"] for r in reports)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=40_000, help="messages pulled and acked in each run (default 40,000)")
    parser.add_argument("--runs", type=int, default=2, help="rounds of every layout and count (default 2)")
    args = parser.parse_args(argv)
    if args.messages < 4:
        parser.error("--messages: must be at least 4 (one per puller)")
    if args.runs < 1:
        parser.error("--runs: must be a positive integer")
    with tempfile.TemporaryDirectory(prefix="deltabus-pull-designs-") as scratch:
        for _ in range(args.runs):
            for layout, procs in (("one", 1), ("one", 2), ("one", 4), ("own", 2), ("own", 4)):
                print(json.dumps(run_once(layout, procs, args.messages, Path(scratch))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
