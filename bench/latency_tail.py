"""Where publish -> push latency goes at a steady rate, message by message (not a test).

    .venv/bin/python bench/latency_tail.py [--rate 500] [--seconds 20] [--warmup 10]

bench/run.py's latency section gives the percentiles; this run splits them. The same
workload (``jobs/deliver.py`` at the section's 0.1 s trigger, a publisher at a steady rate,
the benchmark's endpoint recording each message's first arrival), keeping the job's log.
Each measured message is matched to the micro-batch whose run holds its push's arrival
(the job logs each batch's end and how long it took), and its latency is split in two:
the wait (publish call -> that batch's start) and the time in it (batch start -> arrival).
It prints the split around the p50, from p95 to p99, and at or past the p99, and the
batches' durations and start-to-start gaps. README (Benchmarks, the latency bullet) has the figures of 2026-11-28.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BATCH_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO deltabus\.deliver: batch \d+: delivered (\d+) .* in ([\d.]+)s$", re.M)


def pct(values: Sequence[float], p: float) -> float | None:
    xs = sorted(values)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None


def batches(job_log: str) -> list[tuple[float, float]]:
    """(start, seconds) of each micro-batch the job logged, in start order. The log's times are
    UTC wall clock (conf/log4j2.properties and the job's Python logging alike)."""
    out = []
    for m in BATCH_LINE.finditer(job_log):
        end = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.timezone.utc).timestamp()
        seconds = float(m.group(3))
        out.append((end - seconds, seconds))
    return sorted(out)


def split(published: dict[str, float], seen: dict[str, float], runs: list[tuple[float, float]]) -> dict[str, Any]:
    """The latency of each received message split into wait and time in its batch. Pure."""
    starts = [b[0] for b in runs]
    rows = []  # (latency, wait, in batch, batch seconds)
    for mid, t in published.items():
        arrived = seen.get(mid)
        if arrived is None:
            continue
        i = bisect.bisect_right(starts, arrived) - 1
        if i < 0:
            continue
        start, seconds = runs[i]
        rows.append((arrived - t, start - t, arrived - start, seconds))
    lat = [r[0] for r in rows]
    p50, p95, p99 = pct(lat, 0.5), pct(lat, 0.95), pct(lat, 0.99)

    def part(sel: list[tuple[float, float, float, float]]) -> dict[str, Any]:
        return {"messages": len(sel), "wait_p50_s": pct([r[1] for r in sel], 0.5), "in_batch_p50_s": pct([r[2] for r in sel], 0.5),
                "batch_seconds_p50": pct([r[3] for r in sel], 0.5)}

    gaps = [b[0] - a[0] for a, b in zip(runs, runs[1:])]
    return {
        "messages": len(published), "matched": len(rows), "p50_s": p50, "p95_s": p95, "p99_s": p99, "max_s": pct(lat, 1.0),
        "around_p50": part([r for r in rows if p50 is not None and abs(r[0] - p50) < 0.02]),
        "p95_to_p99": part([r for r in rows if p95 is not None and p99 is not None and p95 <= r[0] < p99]),
        "at_or_past_p99": part([r for r in rows if p99 is not None and r[0] >= p99]),
        "batch_seconds": {p: pct([b[1] for b in runs], q) for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))},
        "batch_start_gaps_s": {p: pct(gaps, q) for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
    }


def run(rate: float, seconds: float, warmup: float, scratch: Path) -> dict[str, Any]:
    from bench.run import LATENCY_TRIGGER, steady_run

    r = steady_run(rate, seconds, warmup, scratch)
    return {"rate": rate, "seconds": seconds, "warmup_seconds": warmup, "trigger_s": LATENCY_TRIGGER,
            **split(r.published, r.seen, batches(r.job_log))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=500.0, help="messages a second (default 500)")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds (default 20)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds at the rate before measuring (default 10)")
    args = parser.parse_args(argv)
    for flag in ("rate", "seconds"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag}: must be a positive number")
    if args.warmup < 0:
        parser.error("--warmup: must be 0 or more seconds")
    import json

    with tempfile.TemporaryDirectory(prefix="deltabus-latency-tail-") as scratch:
        print(json.dumps(run(args.rate, args.seconds, args.warmup, Path(scratch)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
