"""bench/stream_source.py (issue 17's throughput of the stream source against a plain read)
runs end to end at a small size: both sinks get every message, and it writes its JSON.
It asserts counts, never speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import background

ROOT = Path(__file__).resolve().parents[2]


def bench_runs_and_both_sinks_get_every_message(tmp: Path) -> None:
    out = tmp / "result.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "stream_source.py"), "--messages", "600",
                           "--per-trigger", "250", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, env=background.env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["sink_rows_stream"] == result["sink_rows_plain"] == 600
    assert result["stream"]["batches"] == 3  # 250 + 250 + 100
    assert result["stream"]["msgs_per_s"] > 0 and result["plain_read"]["msgs_per_s"] > 0
    assert json.loads(proc.stdout) == result


def test_a_bad_size_is_refused_naming_the_option() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "stream_source.py"), "--per-trigger", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--per-trigger: must be at least 1" in proc.stderr


# A SparkSession in a child process (~20 s): in the background from the session's first test on.
BACKGROUND = {"test_the_bench_of_the_stream_source_runs_and_fills_both_sinks": bench_runs_and_both_sinks_get_every_message}


def test_the_bench_of_the_stream_source_runs_and_fills_both_sinks(early_background) -> None:
    early_background.result("test_the_bench_of_the_stream_source_runs_and_fills_both_sinks")
