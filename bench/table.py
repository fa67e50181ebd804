"""The README's benchmark table, rendered from the results of record (issue 18: "regenerated
from the JSON, not typed by hand").

    .venv/bin/python bench/table.py            # print the table of the newest full results of record
    .venv/bin/python bench/table.py --write    # and put it in README.md between its markers

Each row is one of issue 18's figures: the round-1 value (``bench/results/2026-11-22.json``),
the target, what the newest full run measured, and whether that meets the target.
tests/integration/test_bench_cli.py checks that README.md holds exactly this rendering.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run import (  # noqa: E402  (run.py is a script; its directory's parent is put on the path above)
    IDLE_TARGET_CORES,
    LATENCY_P50_TARGET_S,
    LATENCY_P99_TARGET_S,
    PUBLISH_TARGET,
    PULL_SCALING_TARGET,
    PUSH_COLD_TARGET,
    PUSH_WARM_TARGET,
    RECORD_NAME,
    RESULTS,
    SCALE_COST_TARGET,
)

README = ROOT / "README.md"
ROUND_1 = RESULTS / "2026-11-22.json"
BEGIN = "<!-- bench-table: begin (bench/table.py --write renders this from the results of record; do not edit by hand) -->"
END = "<!-- bench-table: end -->"

Results = dict[str, Any]


class Row(NamedTuple):
    """One figure: its name, how to read it off a run's results (None: not measured), the
    target as text, whether a value meets it, and how to print a value. `lost`: for a
    latency row, the section the percentile comes from; when that section ran but the
    percentile is None, it fell on a message never received (``run.latency_stats``): the
    row says so and is not met."""

    figure: str
    value: Callable[[Results], float | None]
    target: str
    met: Callable[[float], bool]
    show: Callable[[float], str]
    lost: str | None = None


def _get(r: Results, *path: str) -> Any:
    for key in path:
        if not isinstance(r, dict) or key not in r:
            return None
        r = r[key]
    return r


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _pull_scaling(n: int) -> Callable[[Results], float | None]:
    return lambda r: _ratio(_get(r, "pull", f"processes_{n}_msgs_per_s"), _get(r, "pull", "processes_1_msgs_per_s"))


def _latency(key: str, q: str) -> Callable[[Results], float | None]:
    return lambda r: _get(r, key, f"{q}_s")


def _scale(r: Results) -> float | None:
    return _get(r, "scale", "cost_ratio_largest_vs_smallest")


def _scale_label(r: Results | None) -> str:
    sizes = list(_get(r, "scale", "sizes") or {}) if r is not None else []
    return f"{_count(int(sizes[-1]))} vs {_count(int(sizes[0]))}" if len(sizes) >= 2 else "not measured"


def _count(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _x(v: float) -> str:
    return f"{v:.2f}×"


def _s(v: float) -> str:
    return f"{v:.3f} s"


ROWS: tuple[Row, ...] = (
    Row("push, warm (window open), × bare aiohttp → same endpoint", lambda r: _get(r, "push", "ratio_warm"),
        f"≥ {PUSH_WARM_TARGET}×", lambda v: v >= PUSH_WARM_TARGET, _x),
    Row("push, cold (20,000 backlog, job just started, slow start kept), × bare aiohttp", lambda r: _get(r, "push", "ratio_cold"),
        f"≥ {PUSH_COLD_TARGET}×", lambda v: v >= PUSH_COLD_TARGET, _x),
    Row("publish → push latency at 500 msg/s, p50", _latency("latency", "p50"),
        f"≤ {LATENCY_P50_TARGET_S[500]} s", lambda v: v <= LATENCY_P50_TARGET_S[500], _s, "latency"),
    Row("publish → push latency at 500 msg/s, p99", _latency("latency", "p99"),
        f"≤ {LATENCY_P99_TARGET_S[500]} s", lambda v: v <= LATENCY_P99_TARGET_S[500], _s, "latency"),
    Row("publish → push latency at 5,000 msg/s, p99", _latency("latency_5000", "p99"),
        f"< {LATENCY_P99_TARGET_S[5000]} s", lambda v: v < LATENCY_P99_TARGET_S[5000], _s, "latency_5000"),
    Row("pull + ack, 2 processes on one subscription vs 1", _pull_scaling(2),
        f"≥ {PULL_SCALING_TARGET[2]}×", lambda v: v >= PULL_SCALING_TARGET[2], _x),
    Row("pull + ack, 4 processes vs 1", _pull_scaling(4),
        f"≥ {PULL_SCALING_TARGET[4]}×", lambda v: v >= PULL_SCALING_TARGET[4], _x),
    Row("CPU of an idle push job (no messages, 10 push subscriptions)", lambda r: _get(r, "idle", "cores"),
        f"≤ {IDLE_TARGET_CORES} cores", lambda v: v <= IDLE_TARGET_CORES, lambda v: f"{v:.3f} cores"),
    Row("push job CPU per pushed message, largest backlog vs smallest", _scale,
        f"≤ {SCALE_COST_TARGET}× (10M vs 10k)", lambda v: v <= SCALE_COST_TARGET, _x),
    Row("publish_batch × raw write_deltalake", lambda r: _get(r, "publish", "ratio"),
        f"≥ {PUBLISH_TARGET}×", lambda v: v >= PUBLISH_TARGET, _x),
)


def newest_record(results: Path = RESULTS) -> Path:
    """The newest full results of record (``<date>.json``)."""
    found = sorted(p for p in results.glob("*.json") if RECORD_NAME.fullmatch(p.stem))
    if not found:
        raise FileNotFoundError(f"no results of record (<date>.json) in {results}")
    return found[-1]


def render(result: Results, round_1: Results, name: str) -> str:
    """The table (markdown) of `result` (the run written as `name`) beside `round_1`."""
    r, r1 = result["results"], round_1["results"]
    lines = [
        f"Results of record: `bench/results/{name}.json` and `.png` ({result['machine']['cpus']} cores, "
        f"run {result['date']}, {result['seconds'] / 60:.0f} minutes).",
        "",
        "| figure | round 1 | target | measured | met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in ROWS:
        now, before = row.value(r), row.value(r1)
        figure = row.figure
        if row.value is _scale:
            figure += f" ({_scale_label(r)}; round 1: {_scale_label(r1)})"
        lines.append(f"| {figure} | {_shown(row, before, r1)} | {row.target} | {_shown(row, now, r)} | {_met(row, now, r)} |")
    return "\n".join(lines)


def _lost(row: Row, results: Results) -> bool:
    return row.lost is not None and isinstance(results.get(row.lost), dict)


def _shown(row: Row, value: float | None, results: Results) -> str:
    if value is not None:
        return row.show(value)
    if _lost(row, results):
        sec = results[row.lost]  # type: ignore[index]
        return f"not received ({sec.get('received')}/{sec.get('messages')} received)"
    return "not measured"


def _met(row: Row, value: float | None, results: Results) -> str:
    if value is not None:
        return "yes" if row.met(value) else "no"
    return "no" if _lost(row, results) else "not measured"


def replace_block(text: str, table: str) -> str:
    """`text` with the block between BEGIN and END replaced by `table`. ValueError naming the
    marker when either is missing or they are out of order."""
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < 0 or e < b:
        raise ValueError(f"README.md: the markers {BEGIN!r} and {END!r} must both be there, in that order")
    return text[: b + len(BEGIN)] + "\n" + table + "\n" + text[e:]


def block(text: str) -> str:
    """What README `text` holds between the markers."""
    m = re.search(re.escape(BEGIN) + r"\n(.*)\n" + re.escape(END), text, re.S)
    if m is None:
        raise ValueError(f"README.md: no block between {BEGIN!r} and {END!r}")
    return m.group(1)


def render_record(path: Path | None = None) -> str:
    path = path or newest_record()
    return render(json.loads(path.read_text()), json.loads(ROUND_1.read_text()), path.stem)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/table.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("record", nargs="?", type=Path, help="a results JSON (default: the newest full results of record)")
    p.add_argument("--write", action="store_true", help="put the table in README.md between its markers")
    args = p.parse_args(argv)
    table = render_record(args.record)
    print(table)
    if args.write:
        README.write_text(replace_block(README.read_text(), table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
