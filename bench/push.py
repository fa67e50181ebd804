"""Push figures (not a test): delivered-and-acked messages/s to one healthy loopback endpoint,
and publish -> ack latency at a steady publish rate.

    .venv/bin/python bench/push.py [--messages 30000] [--rate 200] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[4]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _setup(name: str):
    from deltabus import PublisherClient, SubscriberClient

    wh = tempfile.mkdtemp()
    pub, sub = PublisherClient(warehouse=wh), SubscriberClient(warehouse=wh, allow_http=True)
    topic = pub.topic_path("bench", name)
    pub.create_topic(name=topic)
    return wh, pub, sub, topic


def throughput(spark, n: int) -> dict:
    from deltabus import config
    from deltabus.push import runner
    from tests.endpoints import ProcessEndpoint

    wh, pub, sub, topic = _setup("push")
    with ProcessEndpoint() as ep:
        s = sub.subscription_path("bench", "push")
        sub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        for start in range(0, n, 1000):
            pub.publish_batch(topic, [{"data": b"x" * 1024}] * min(1000, n - start))
        t0 = time.time()
        summary = runner.run(spark, config.Settings(warehouse=wh, allow_http=True, trigger_interval=0.2), until_idle=True)
        elapsed = time.time() - t0
    return {
        "messages": n,
        "acked": summary.acked,
        "received": ep.received,
        "job_seconds": round(elapsed, 2),
        "msgs_per_s_whole_run": round(summary.acked / elapsed, 1),
    }


def latency(spark, rate: float, seconds: float) -> dict:
    from deltabus import config
    from deltabus.push import runner
    from tests.endpoints import Endpoint

    wh, pub, sub, topic = _setup("latency")
    with Endpoint() as ep:
        s = sub.subscription_path("bench", "latency")
        sub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        stop = threading.Event()
        job = threading.Thread(target=runner.run, args=(spark, config.Settings(warehouse=wh, allow_http=True, trigger_interval=0.1)), kwargs={"stop": stop})
        job.start()
        time.sleep(8)  # let the stream start
        published = {}
        t_end = time.time() + seconds
        tick = 0.1
        while time.time() < t_end:
            start = time.time()
            ids = pub.publish_batch(topic, [{"data": b"x" * 256}] * max(1, int(rate * tick)))
            for i in ids:
                published[i] = start
            time.sleep(max(0.0, tick - (time.time() - start)))
        deadline = time.time() + 60
        while time.time() < deadline and len({json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()}) < len(published):
            time.sleep(0.2)
        stop.set()
        job.join(120)
        first_seen = {}
        for r in ep.snapshot():
            mid = json.loads(r.body)["message"]["messageId"]
            first_seen.setdefault(mid, r.at)
    lat = sorted(first_seen[m] - published[m] for m in published if m in first_seen)
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 3)
    return {"rate": rate, "seconds": seconds, "messages": len(published), "received": len(lat), "p50_s": q(0.5), "p99_s": q(0.99), "max_s": round(lat[-1], 3)}


def main() -> None:  # noqa: D103
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=30_000)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--seconds", type=float, default=30)
    args = p.parse_args()
    spark = session()
    out = {"throughput": throughput(spark, args.messages), "latency": latency(spark, args.rate, args.seconds)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
