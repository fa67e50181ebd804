"""What a seek costs over a large backlog (issue 15), not a test.

    .venv/bin/python bench/seek.py [--messages 1000000] [--size 100] [--per-commit 50000]

One subscription with ``retain_acked_messages`` gets MESSAGES messages of SIZE bytes,
published in commits of PER_COMMIT. Then, each step timed on its own (wall seconds, and
the process's CPU seconds):

1. fan-out: one pull fans every message out into the deliveries partition (one commit);
2. snapshot: ``create_snapshot`` with every message unacked (their keys are copied);
3. seek forward (``time`` = now + 1 h): every message counts as acked, the partition empties;
4. seek back (``time`` = 0): every message comes back from the messages table (retention);
5. seek to the middle publish time: half dropped, half kept (made due again);
6. seek forward again, then seek to the snapshot: every message comes back from the
   snapshot's stored keys.

Prints one JSON object; the warehouse is made in a scratch directory removed at the end.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))


def timed(label: str, fn: Callable[[], Any], out: dict[str, Any], rows: Callable[[], int]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    out[label] = {"seconds": round(time.perf_counter() - wall, 2), "cpu_seconds": round(time.process_time() - cpu, 2),
                  "unacked_after": rows()}
    print(f"{label}: {out[label]}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--per-commit", type=int, default=50_000)
    args = ap.parse_args()

    from deltabus import PublisherClient, SubscriberClient

    result: dict[str, Any] = {"messages": args.messages, "size": args.size, "per_commit": args.per_commit}
    with tempfile.TemporaryDirectory(prefix="deltabus-seek-bench-") as scratch:
        wh = str(Path(scratch) / "wh")
        pub, sub = PublisherClient(warehouse=wh), SubscriberClient(warehouse=wh)
        topic, name = pub.topic_path("bench", "seek"), sub.subscription_path("bench", "seek")
        pub.create_topic(name=topic)
        sub.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True})
        rec = sub._sub(name)
        data = b"x" * args.size
        t0 = time.perf_counter()
        middle = 0.0
        for start in range(0, args.messages, args.per_commit):
            n = min(args.per_commit, args.messages - start)
            pub.publish_batch(topic, [{"data": data}] * n)
            if start < args.messages // 2 <= start + n:
                middle = time.time()
        result["publish_seconds"] = round(time.perf_counter() - t0, 2)

        def unacked() -> int:
            return sub.engine.snapshot("deliveries").read(columns=["message_id"], partition=rec.sub_uid).num_rows

        snap = sub.snapshot_path("bench", "all")
        timed("fan_out", lambda: sub.pull(subscription=name, max_messages=1, return_immediately=True), result, unacked)
        timed("create_snapshot", lambda: sub.create_snapshot(name=snap, subscription=name), result, unacked)
        timed("seek_forward", lambda: sub.seek(subscription=name, time=time.time() + 3600), result, unacked)
        timed("seek_back_by_time", lambda: sub.seek(subscription=name, time=0), result, unacked)
        timed("seek_to_middle", lambda: sub.seek(subscription=name, time=middle), result, unacked)
        sub.seek(subscription=name, time=time.time() + 3600)
        timed("seek_to_snapshot", lambda: sub.seek(subscription=name, snapshot=snap), result, unacked)
        result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        sub.close()
        pub.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
