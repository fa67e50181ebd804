"""The push job's memory with a backlog of 10 MB messages far beyond its byte cap (not a test).

    .venv/bin/python bench/memory.py [--messages N] [--out FILE]

Issue 18 asks that 30,000 queued 10 MB messages not exhaust the driver: the push queue is
capped in bytes (``Settings.max_queued_bytes``, 256 MiB by default) as well as in messages.
tests/integration/test_push_memory.py proves the mechanism (12 messages under a 25 MB cap:
the endpoint never holds a third); this run shows it at the default cap with a real backlog,
from outside the job:

1. N messages of 10 MB (``validation.MAX_DATA_BYTES``, Pub/Sub's limit) are published to a
   topic with one push subscription, five to a ``publish_batch``. Each message is one byte
   repeated, which keeps the warehouse to about 1.7 MiB a message on disk (measured with
   3,000); in memory, on the wire and at the endpoint each is its full size.
2. ``jobs/deliver.py --until-idle`` (through ./spark-submit.sh, default settings, so the
   default cap) pushes them to bench/endpoint.py's acking endpoint.
3. Every 0.25 s the run reads the resident memory (/proc stat's rss) of every process in the
   job's tree, by role (``_role``): the launchers, the driver JVM, the Python driver, the
   stream source's Python runner, pyspark's worker daemon with its forks (the push
   workers), and pyspark's data source daemons; "other" is anything else, such as a
   short-lived helper the JVM spawns (sharing the JVM's memory until it execs, so its RSS
   repeats the JVM's). RSS, not PSS: pages a forked worker shares with its daemon count in
   both.
   It reports each one's peak, the peak of their sum, and the job's own count of the most
   message bytes leased and unsettled at once (its last log line).

A job that held its backlog would need N x 10 MB in the driver (or more: the payloads,
their base64 bodies). Writes bench/results/<date>-memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import procs  # noqa: E402

PER_BATCH = 5
SAMPLE_SECONDS = 0.25
SERIES_SECONDS = 5.0
JOB_TIMEOUT = 3 * 3600.0  # seconds; 30,000 messages take about 30 minutes here


def _role(cmd: str) -> str:
    """What a process of the job's tree is, from its command line. The launchers come first:
    their command lines name jobs/deliver.py too."""
    program = os.path.basename(cmd.split(" ", 1)[0])
    if program in ("bash", "sh", "dash") or "own_session.py" in cmd:
        return "launcher"  # ./spark-submit.sh, .venv/bin/spark-submit, scripts/own_session.py
    if program == "java":
        return "jvm"
    if "python_streaming_source_runner" in cmd:
        return "stream_source"  # the stream source's Python runner (one per query)
    if "pyspark.sql.worker." in cmd:
        return "data_source_workers"  # pyspark's daemons for the stream source's planning calls
    if "pyspark.daemon" in cmd:
        return "pyspark_workers"  # pyspark's worker daemon and its forks: the push workers
    if "deliver.py" in cmd:
        return "python_driver"
    return "other"


class Sampler(threading.Thread):
    """Peaks of resident memory in the process tree under `root`, by role and in total."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peaks: dict[str, int] = {}
        self.peak_total = 0
        self.samples = 0
        self.series: list[tuple[float, dict[str, int]]] = []  # (seconds in, MiB by role) every SERIES_SECONDS
        self._done = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._done.is_set():
            now = procs.processes(cmdline=True)
            by_role: dict[str, int] = {}
            for pid in procs.tree(now, self.root):
                role = _role(now[pid].cmd)
                by_role[role] = by_role.get(role, 0) + now[pid].rss
            for role, rss in by_role.items():
                self.peaks[role] = max(self.peaks.get(role, 0), rss)
            self.peak_total = max(self.peak_total, sum(by_role.values()))
            self.samples += 1
            at = time.monotonic() - t0
            if not self.series or at - self.series[-1][0] >= SERIES_SECONDS:
                self.series.append((round(at, 1), {r: round(b / 2**20) for r, b in sorted(by_role.items())}))
            self._done.wait(SAMPLE_SECONDS)

    def stop(self) -> None:
        self._done.set()
        self.join(5)


def run(messages: int, scratch: Path) -> dict[str, Any]:
    from bench.endpoint import BenchEndpoint
    from bench.run import _clients, _deliver, _job_log, log
    from deltabus.validation import MAX_DATA_BYTES

    wh = tempfile.mkdtemp(prefix="memory-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "memory")
    pub.create_topic(name=topic)
    with BenchEndpoint() as ep:
        name = sub.subscription_path("bench", "memory")
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url}, ack_deadline_seconds=600)
        t0 = time.monotonic()
        for start in range(0, messages, PER_BATCH):
            pub.publish_batch(topic, [{"data": bytes([i % 251]) * MAX_DATA_BYTES} for i in range(start, min(messages, start + PER_BATCH))])
        publish_s = time.monotonic() - t0
        disk = sum(f.stat().st_size for f in Path(wh).rglob("*.parquet"))
        log(f"memory: published {messages:,} x {MAX_DATA_BYTES:,} B in {publish_s:.0f} s ({disk / 2**20:,.0f} MiB on disk)")
        t0 = time.monotonic()
        proc = _deliver(wh, until_idle=True, max_seconds=None)
        sampler = Sampler(proc.pid)
        sampler.start()
        try:
            proc.wait(timeout=JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"deliver.py did not finish {messages:,} messages in {JOB_TIMEOUT:.0f} s") from None
        finally:
            sampler.stop()
        push_s = time.monotonic() - t0
        job_log = _job_log(proc, 400)
        pushed = ep.stats()["count"]
    if proc.returncode != 0:
        raise RuntimeError(f"deliver.py exited {proc.returncode}:\n{job_log[-4000:]}")
    held = re.search(r"at most (\d+) message bytes held at once \(cap (\d+)\)", job_log)
    acked = re.search(r"^deliver: .*; delivered (\d+), acked (\d+)", job_log, re.M)
    out: dict[str, Any] = {
        "messages": messages, "message_bytes": MAX_DATA_BYTES, "backlog_bytes": messages * MAX_DATA_BYTES,
        "warehouse_bytes_on_disk": disk, "publish_seconds": round(publish_s, 1), "job_seconds": round(push_s, 1),
        "pushed": pushed, "acked": int(acked.group(2)) if acked else None,
        "cap_bytes": int(held.group(2)) if held else None,
        "peak_held_bytes": int(held.group(1)) if held else None,
        "peak_rss_bytes": dict(sorted(sampler.peaks.items())), "peak_rss_total_bytes": sampler.peak_total,
        "rss_samples": sampler.samples, "rss_mib_every_5_s": sampler.series,
    }
    mb = {k: round(v / 2**20) for k, v in out["peak_rss_bytes"].items()}
    log(f"memory: {pushed:,} pushed in {push_s:.0f} s; most message bytes held at once {out['peak_held_bytes']} "
        f"(cap {out['cap_bytes']}); peak RSS MiB {mb}, whole job {out['peak_rss_total_bytes'] / 2**20:.0f}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=3_000, help="10 MB messages in the backlog (default 3,000: 30 GB, ~5 GiB on disk)")
    parser.add_argument("--out", help="JSON file (default bench/results/<date>-memory.json)")
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages: must be a positive integer")
    from bench.server import code_revision

    with tempfile.TemporaryDirectory(prefix="deltabus-memory-") as scratch:
        result = run(args.messages, Path(scratch))
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "code": code_revision(), "memory": result}
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"{time.strftime('%Y-%m-%d', time.gmtime())}-memory.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
