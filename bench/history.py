"""What the delivery history (issue 17) costs: push and pull+ack throughput with it on and off,
in one run (not a test).

    .venv/bin/python bench/history.py [--messages 20000] [--rounds 2] [--pull-messages 5000] [--out PATH]

Push: one local SparkSession; each run publishes N messages to a fresh topic with one push
subscription to the same acking endpoint (bench/endpoint.py, its own process) and runs the
push job (``push.runner.run``, until idle) with ``Settings.delivery_history`` on or off,
alternating on, off, on, off... so drift on this shared machine hits both alike. Throughput is
N / (the endpoint's first request -> the job idle: every ack merged). Pull + ack: the
subscriber client's pull (100 at a time) and acknowledge, history on and off, alternating.
Push commit path: ``push.plan.execute`` alone in this process, acks and the next leases in
one MERGE per round, as the job's batches (the driver's share, where the history's cost lands).
Each run also records CPU seconds per message (this process and its descendants: the JVM,
Spark's Python workers, the endpoint; psutil, installed with the test extras), steadier than wall
time on a shared machine. Writes
bench/results/<date>-history.json (UTC date) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))
sys.path.insert(0, str(ROOT))

from bench.endpoint import BenchEndpoint  # noqa: E402


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its live descendants (Spark's JVM, its
    Python workers, the endpoint's process): less disturbed than wall time by other load on
    a shared machine."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def push_run(spark, warehouse: str, endpoint: BenchEndpoint, n: int, history: bool, tag: str) -> dict:
    from deltabus import PublisherClient, SubscriberClient, config
    from deltabus.delivery import history as hist
    from deltabus.push import runner
    from deltabus.storage import open_engine

    pub = PublisherClient(warehouse=warehouse)
    sub = SubscriberClient(warehouse=warehouse, allow_http=True)
    topic = pub.topic_path("bench", f"topic-{tag}")
    pub.create_topic(name=topic)
    name = sub.subscription_path("bench", f"push-{tag}")
    sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": endpoint.url})
    for start in range(0, n, 5000):
        pub.publish_batch(topic, [{"data": b"x" * 100} for _ in range(start, min(n, start + 5000))])
    endpoint.reset()
    cpu0 = cpu_seconds()
    settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.2, backlog_interval=1.0,
                               engine="delta-rs", delivery_history=history)
    summary = runner.run(spark, settings, until_idle=True, max_seconds=600)
    done = time.time()
    cpu = cpu_seconds() - cpu0
    stats = endpoint.stats()
    seconds = done - stats["first"]
    rows = hist.read(open_engine(warehouse, engine="delta-rs").snapshot("deliveries"), name).num_rows
    pub.stop()
    sub.close()
    assert summary.acked >= n, summary
    return {"history": history, "messages": n, "seconds": round(seconds, 3), "msg_per_s": round(n / seconds, 1),
            "cpu_ms_per_msg": round(1000.0 * cpu / n, 4), "history_rows": rows, "pushes": stats["count"]}


def pull_run(warehouse: str, n: int, history: bool, tag: str) -> dict:
    from deltabus import PublisherClient, SubscriberClient

    pub = PublisherClient(warehouse=warehouse)
    sub = SubscriberClient(warehouse=warehouse, history=history)
    topic = pub.topic_path("bench", f"pull-topic-{tag}")
    pub.create_topic(name=topic)
    name = sub.subscription_path("bench", f"pull-{tag}")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=60)
    pub.publish_batch(topic, [{"data": b"x" * 100} for _ in range(n)])
    got = 0
    cpu0 = time.process_time()
    began = time.perf_counter()
    while got < n:
        resp = sub.pull(subscription=name, max_messages=100, return_immediately=True)
        if not resp.received_messages:
            continue
        sub.acknowledge(subscription=name, ack_ids=[r.ack_id for r in resp.received_messages])
        got += len(resp.received_messages)
    seconds = time.perf_counter() - began
    cpu = time.process_time() - cpu0
    pub.stop()
    sub.close()
    return {"history": history, "messages": n, "seconds": round(seconds, 3), "msg_per_s": round(n / seconds, 1),
            "cpu_ms_per_msg": round(1000.0 * cpu / n, 4)}


def commit_path_run(scratch: str, n: int, history: bool, room: int = 2000) -> dict:
    """The push job's commit path alone, in this process (no Spark, no HTTP): ``push.plan.execute``
    committing each round's acks (with their push detail) and the next `room` leases in one MERGE,
    as the job's batches do, until `n` messages are acked. Its CPU is where the history's cost
    lands (building, deciding on the snapshot and writing the rows); measured alone it is not
    drowned by the endpoint's and Spark's share, nor by other load on the machine."""
    import pyarrow as pa

    from deltabus import PublisherClient, SubscriberClient
    from deltabus.delivery.history import HistorySettings
    from deltabus.push import plan
    from deltabus.registry import Registry
    from deltabus.storage import open_engine

    warehouse = tempfile.mkdtemp(prefix="commit-path-", dir=scratch)
    pub = PublisherClient(warehouse=warehouse)
    topic = pub.topic_path("bench", "commit-path")
    pub.create_topic(name=topic)
    with SubscriberClient(warehouse=warehouse, allow_http=True) as sub:
        name = sub.subscription_path("bench", "commit-path")
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    for start in range(0, n, 5000):
        pub.publish_batch(topic, [{"data": b"x" * 100} for _ in range(start, min(n, start + 5000))])
    pub.stop()
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).subscription(name)
    settings = HistorySettings(enabled=history)
    empty = pa.table({"topic_uid": pa.array([], pa.string())})
    leased: list[tuple[str, int]] = []
    acked = 0
    cpu0, began = time.process_time(), time.perf_counter()
    while True:
        outcomes = {}
        if leased:
            k = len(leased)
            acks = pa.table({
                "message_id": [m for m, _ in leased], "delivery_attempt": pa.array([a for _, a in leased], pa.int32()),
                "outcome": ["ack"] * k, "status": pa.array([204] * k, pa.int32()), "error": [""] * k, "latency_seconds": [0.003] * k,
            })
            outcomes[rec.sub_uid] = (acks, acks.slice(0, 0))
            acked += k
        elif acked >= n:
            break
        v = engine.version("messages")
        result = engine.transact("deliveries", lambda snap: plan.execute(
            engine, snap, [plan.SubPlan(rec, room)], outcomes, empty, v, v, now=time.time(), batch_txn=None, history=settings),
            what="commit path")
        leased = result.leases.get(rec.sub_uid, [])
    cpu, seconds = time.process_time() - cpu0, time.perf_counter() - began
    return {"history": history, "messages": n, "seconds": round(seconds, 3), "msg_per_s": round(n / seconds, 1),
            "cpu_ms_per_msg": round(1000.0 * cpu / n, 4)}


def cost(runs: list[dict]) -> dict:
    on = [r["msg_per_s"] for r in runs if r["history"]]
    off = [r["msg_per_s"] for r in runs if not r["history"]]
    mean_on, mean_off = statistics.mean(on), statistics.mean(off)
    cpu_on = statistics.mean(r["cpu_ms_per_msg"] for r in runs if r["history"])
    cpu_off = statistics.mean(r["cpu_ms_per_msg"] for r in runs if not r["history"])
    return {"on_msg_per_s": round(mean_on, 1), "off_msg_per_s": round(mean_off, 1),
            "cost_pct": round(100.0 * (mean_off - mean_on) / mean_off, 1),
            "on_cpu_ms_per_msg": round(cpu_on, 4), "off_cpu_ms_per_msg": round(cpu_off, 4),
            "cpu_cost_pct": round(100.0 * (cpu_on - cpu_off) / cpu_off, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2, help="on/off pairs (default 2: on, off, on, off)")
    ap.add_argument("--pull-messages", type=int, default=5_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("deltabus-bench-history")
             .config("spark.ui.showConsoleProgress", "false").config("spark.log.level", "ERROR").getOrCreate())
    push, pull = [], []
    with tempfile.TemporaryDirectory(prefix="deltabus-bench-history-") as scratch, BenchEndpoint() as endpoint:
        warehouse = os.path.join(scratch, "warehouse")
        from deltabus import PublisherClient

        PublisherClient(warehouse=warehouse).stop()  # creates the warehouse
        # A warm-up run (not counted): the JVM, the job's first micro-batches, the caches.
        push_run(spark, warehouse, endpoint, min(2000, args.messages), True, "warmup")
        for i in range(args.rounds):
            for on in (True, False):
                r = push_run(spark, warehouse, endpoint, args.messages, on, f"{i}-{'on' if on else 'off'}")
                print(json.dumps(r), flush=True)
                push.append(r)
        for i in range(args.rounds):
            for on in (True, False):
                r = pull_run(warehouse, args.pull_messages, on, f"{i}-{'on' if on else 'off'}")
                print(json.dumps(r), flush=True)
                pull.append(r)
        commits = []
        for i in range(args.rounds + 1):
            for on in (True, False):
                r = commit_path_run(scratch, args.messages, on)
                print(json.dumps(r), flush=True)
                commits.append(r)
    spark.stop()
    result = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "push": {"runs": push, **cost(push)},
        "pull_ack": {"runs": pull, **cost(pull)},
        "push_commit_path": {"runs": commits, **cost(commits)},
    }
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}-history.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    import psutil

    result["machine"]["load_average"] = [round(v, 2) for v in psutil.getloadavg()]
    print("| path | history on (msg/s) | history off (msg/s) | throughput cost | CPU on (ms/msg) | CPU off (ms/msg) | CPU cost |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, key in (("push", "push"), ("pull + ack", "pull_ack"), ("push commit path (driver)", "push_commit_path")):
        r = result[key]
        print(f"| {label} | {r['on_msg_per_s']:,} | {r['off_msg_per_s']:,} | {r['cost_pct']} % | {r['on_cpu_ms_per_msg']} "
              f"| {r['off_cpu_ms_per_msg']} | {r['cpu_cost_pct']} % |")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
