"""bench/run.sh's command line: bad sections are refused before anything runs, and only a
full run of every section writes the day's results of record (no benchmark is run here
except one small --quick section)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.run import RESULTS, SECTIONS, Options, figure, latency_stats, parse_args, result_stem
from tests.conftest import ROOT

DAY = dt.date(2026, 11, 23)


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("only, unknown", [("nosuch", "'nosuch'"), ("push,latncy", "'latncy'")])
def test_unknown_section_is_one_line_naming_the_flag_and_the_valid_sections(only, unknown, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--only", only])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "--only" in err and unknown in err and ", ".join(SECTIONS) in err


@pytest.mark.parametrize("only", ["", ",", " , "])
def test_no_section_is_an_error(only, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--only", only])
    assert exit_.value.code == 2
    assert "--only" in capsys.readouterr().err


def test_sections_run_in_their_order_once_each():
    assert parse_args(["--only", "scale, push,push"]).sections == ("push", "scale")
    assert parse_args([]).sections == SECTIONS


@pytest.mark.parametrize(
    "argv, name, of_record",
    [
        ([], "2026-11-23", True),
        (["--only", ",".join(reversed(SECTIONS))], "2026-11-23", True),  # every section: a full run
        (["--quick"], "2026-11-23-quick", False),
        (["--only", "push"], "2026-11-23-partial-push", False),
        (["--only", "scale,publish"], "2026-11-23-partial-publish+scale", False),
        (["--quick", "--only", "latency"], "2026-11-23-quick-partial-latency", False),
    ],
)
def test_only_a_full_run_is_written_as_the_results_of_record(argv, name, of_record):
    opts = parse_args(argv)
    assert opts.of_record is of_record
    assert result_stem(opts, DAY) == RESULTS / name


@pytest.mark.parametrize("argv", [["--quick"], ["--only", "push"], ["--quick", "--only", "pull,push"]])
def test_smoke_and_partial_results_are_ignored_by_git(argv):
    stem = result_stem(parse_args(argv), DAY)
    paths = [f"{stem.relative_to(ROOT)}.json", f"{stem.relative_to(ROOT)}.png"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == paths
    record = result_stem(parse_args([]), DAY).relative_to(ROOT)
    assert subprocess.run(["git", "check-ignore", "-q", f"{record}.json"], cwd=ROOT).returncode == 1


def test_out_chooses_the_path_but_a_partial_run_may_not_take_the_record_s(tmp_path, capsys):
    assert result_stem(parse_args(["--only", "push", "--out", str(tmp_path / "x")]), DAY) == tmp_path / "x"
    assert parse_args(["--out", str(RESULTS / "2026-11-23")]) == Options(SECTIONS, False, RESULTS / "2026-11-23")
    for argv in (["--only", "push"], ["--quick"]):
        with pytest.raises(SystemExit) as exit_:
            parse_args([*argv, "--out", str(RESULTS / "2026-11-23")])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--out" in err and "results of record" in err


def test_run_sh_refuses_an_unknown_section_and_writes_nothing():
    before = _snapshot(RESULTS)
    proc = subprocess.run([str(ROOT / "bench" / "run.sh"), "--only", "nosuch"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("deltabus setup:")]
    assert len(lines) == 1, proc.stderr
    assert "--only" in lines[0] and "nosuch" in lines[0] and ", ".join(SECTIONS) in lines[0]
    assert proc.stdout == ""
    assert _snapshot(RESULTS) == before


def test_quick_partial_run_writes_its_own_files_and_leaves_no_scratch_behind(tmp_path):
    """One cheap real section, run from another directory: results go where --out says, with
    the sections recorded, and the warehouses it made (under TMPDIR) are gone afterwards."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    before = _snapshot(RESULTS)
    env = {**os.environ, "TMPDIR": str(scratch)}
    # Run from elsewhere: a relative --out is the caller's, as with any command.
    proc = subprocess.run([str(ROOT / "bench" / "run.sh"), "--quick", "--only", "pull", "--out", "res"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "res.json").read_text())
    assert result["quick"] is True and result["sections"] == ["pull"] and list(result["results"]) == ["pull"]
    assert result["results"]["pull"]["processes_1_acked"] == result["results"]["pull"]["messages"]
    assert (tmp_path / "res.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res.json", "res.png", "tmp"]  # no .tmp halves left
    assert list(scratch.iterdir()) == []
    assert _snapshot(RESULTS) == before


def _record() -> dict:
    """The newest committed full results of record, read only."""
    from bench.table import newest_record

    return json.loads(newest_record().read_text())


def test_the_results_of_record_measure_every_section_in_one_run():
    """Issue 18: one run measures every row of its table (latency at both rates, pull by 1, 2
    and 4 processes, the backlog up to 10M, the idle job)."""
    r = _record()["results"]
    assert set(SECTIONS) <= set(r) and "latency_5000" in r
    assert {f"processes_{n}_msgs_per_s" for n in (1, 2, 4)} <= set(r["pull"])
    assert list(r["scale"]["sizes"])[-1] == "10000000"


def test_the_readme_table_is_the_rendering_of_the_results_of_record():
    """The README's benchmark table is regenerated from the JSON (``bench/table.py --write``),
    never typed by hand."""
    from bench.table import README, block, render_record

    assert block(README.read_text()) == render_record()


def test_the_table_says_met_not_met_and_not_measured():
    from bench.table import render

    base = {"date": "2026-11-27T00:00:00+00:00", "machine": {"cpus": 2}, "seconds": 600}
    now = {**base, "results": {"push": {"ratio_warm": 0.8, "ratio_cold": 0.59}, "idle": {"cores": 0.05},
                               "pull": {"processes_1_msgs_per_s": 100.0, "processes_2_msgs_per_s": 171.0}}}
    lines = {line.split(" | ")[0].lstrip("| "): line for line in render(now, {**base, "results": {}}, "x").splitlines() if line.startswith("| ")}
    assert lines["push, warm (window open), × bare aiohttp → same endpoint"].endswith("| 0.80× | yes |")
    assert lines["push, cold (20,000 backlog, job just started, slow start kept), × bare aiohttp"].endswith("| 0.59× | no |")
    assert lines["CPU of an idle push job (no messages, 10 push subscriptions)"].endswith("| 0.050 cores | yes |")
    assert lines["pull + ack, 2 processes on one subscription vs 1"].endswith("| 1.71× | yes |")
    assert lines["pull + ack, 4 processes vs 1"].endswith("| not measured | not measured |")
    assert "| not measured | ≥ 0.8× |" in lines["push, warm (window open), × bare aiohttp → same endpoint"]  # round 1 absent
    # A percentile that fell on a message never received is a miss, not a row that never ran;
    # and the strict target (p99 under 1 s) is not met at exactly 1 s.
    late = {**base, "results": {"latency": {"p50_s": 0.09, "p99_s": None, "received": 90, "messages": 100},
                                "latency_5000": {"p50_s": 0.5, "p99_s": 1.0, "received": 100, "messages": 100}}}
    lines = {line.split(" | ")[0].lstrip("| "): line for line in render(late, {**base, "results": {}}, "x").splitlines() if line.startswith("| ")}
    assert lines["publish → push latency at 500 msg/s, p50"].endswith("| 0.090 s | yes |")
    assert lines["publish → push latency at 500 msg/s, p99"].endswith("| not received (90/100 received) | no |")
    assert lines["publish → push latency at 5,000 msg/s, p99"].endswith("| 1.000 s | no |")


def test_the_readme_markers_are_required():
    from bench.table import replace_block

    with pytest.raises(ValueError, match="markers"):
        replace_block("no markers here", "| table |")


@pytest.mark.parametrize("sections", [SECTIONS, *[(s,) for s in SECTIONS], ("publish", "pull"), ("push", "scale")], ids="+".join)
def test_chart_has_a_labelled_panel_per_section_that_ran(sections):
    import matplotlib.pyplot as plt

    record = _record()
    result = {**record, "results": {k: v for k, v in record["results"].items() if k in sections or k.startswith("latency") and "latency" in sections}}
    fig = figure(result)
    try:
        panels = {"publish" if s == "pull" else s for s in sections}  # publish and pull share a panel
        main = [ax for ax in fig.axes if ax.get_title()]
        assert len(main) == len(panels), [ax.get_title() for ax in fig.axes]  # no empty panels
        for ax in fig.axes:
            assert ax.get_ylabel().strip(), f"panel {ax.get_title()!r}: no y label"
            assert ax.has_data()
        for ax in main:
            assert ax.get_xlabel().strip(), f"panel {ax.get_title()!r}: no x label"
    finally:
        plt.close(fig)


def test_latency_stats_rank_lost_messages_last_and_survive_none_received():
    published = {f"m{i}": 100.0 for i in range(100)}
    seen = {f"m{i}": 100.0 + i / 100 for i in range(98)}  # m98 and m99 never arrived
    stats = latency_stats(published, seen)
    assert (stats["messages"], stats["received"], stats["p50_s"], stats["p99_s"], stats["max_received_s"]) == (100, 98, 0.5, None, 0.97)
    # A run in which nothing arrived (the job never came up) still reports, instead of an IndexError.
    assert latency_stats(published, {}) == {"messages": 100, "received": 0, "p50_s": None, "p99_s": None, "max_received_s": None, "samples": []}


@pytest.mark.parametrize(
    "argv, name",
    [
        (["--engine", "delta-spark"], "2026-11-23-variant-delta-spark"),
        (["--master", "spark://127.0.0.1:7077"], "2026-11-23-variant-delta-rs-spark-127-0-0-1-7077"),
        (["--quick", "--engine", "delta-spark", "--master", "local[2]"], "2026-11-23-quick-variant-delta-spark-local-2"),
        (["--only", "pull", "--engine", "delta-spark"], "2026-11-23-partial-pull-variant-delta-spark"),
    ],
)
def test_another_engine_or_master_is_a_variant_never_the_results_of_record(argv, name):
    opts = parse_args(argv)
    assert not opts.of_record and opts.variant
    stem = result_stem(opts, DAY)
    assert stem == RESULTS / name
    path = f"{stem.relative_to(ROOT)}.json"
    assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, f"{path} is not ignored"
    with pytest.raises(SystemExit):  # nor may --out put it there
        parse_args([*argv, "--out", str(RESULTS / "2026-11-23")])


def test_engines_section_runs_only_when_named_and_has_its_own_record(capsys):
    assert "engines" not in parse_args([]).sections
    record = parse_args(["--only", "engines"])
    assert record.of_record and result_stem(record, DAY) == RESULTS / "2026-11-23-engines"
    quick = result_stem(parse_args(["--quick", "--only", "engines"]), DAY).relative_to(ROOT)
    assert subprocess.run(["git", "check-ignore", "-q", f"{quick}.json"], cwd=ROOT).returncode == 0
    assert subprocess.run(["git", "check-ignore", "-q", f"bench/results/2026-11-23-engines.json"], cwd=ROOT).returncode == 1
    assert result_stem(parse_args(["--only", "push,engines"]), DAY) == RESULTS / "2026-11-23-partial-push+engines"
    for argv in (["--quick", "--only", "engines"], ["--only", "push"], []):  # only an engines run writes its record
        with pytest.raises(SystemExit):
            parse_args([*argv, "--out", str(RESULTS / "2026-11-23-engines")])
    for flag in (["--engine", "delta-spark"], ["--master", "local[2]"]):  # it chooses engines and masters itself
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--only", "engines", *flag])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert flag[0] in err and "engines section" in err


@pytest.mark.parametrize("argv, flag", [(["--engine", "auto"], "--engine"), (["--master", "local [2]"], "--master")])
def test_bad_engine_or_master_is_one_line_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and flag in err, err


ENGINES_RESULT = {
    "local_master": "local[4]", "cluster": {"workers": 2, "cores": 3},
    "pull": {"delta-rs": {"processes_1_msgs_per_s": 9000.4}, "delta-spark": {"processes_1_msgs_per_s": 850.0}},
    "runs": [
        {"engine": "delta-rs", "master": "local", "push_msgs_per_s": 7100.2,
         "latency": {"target_rate": 500.0, "messages": 100, "received": 100, "p50_s": 0.21, "p99_s": 0.4}},
        {"engine": "delta-spark", "master": "local", "push_msgs_per_s": 1234.5,
         "latency": {"target_rate": 50.0, "messages": 100, "received": 98, "p50_s": 0.9, "p99_s": None}},
        {"engine": "delta-rs", "master": "standalone", "error": "deliver.py exited 1:\nboom"},
    ],
}


def test_engines_table_has_a_row_per_engine_and_master_and_pull_per_engine():
    from bench.run import engines_table

    lines = engines_table(ENGINES_RESULT).splitlines()
    assert lines[0].startswith("| engine | master | push msg/s | publish → push p50 / p99 (at msg/s) | pull")
    assert lines[2] == "| delta-rs | local (`local[4]`) | 7,100 | 0.21 s / 0.40 s (at 500) | 9,000 |"
    assert lines[3] == "| delta-spark | local (`local[4]`) | 1,234 | 0.90 s / not received (at 50) (98/100 received) | 850 |"
    assert lines[4] == "| delta-rs | standalone, 2 workers × 3 slots | failed: deliver.py exited 1: | – | 9,000 |"
    assert len(lines) == 5


def test_chart_has_an_engines_panel_of_the_runs_that_worked():
    import matplotlib.pyplot as plt

    record = _record()
    fig = figure({**record, "results": {"engines": ENGINES_RESULT}})
    try:
        (ax,) = fig.axes
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert [t.get_text() for t in ax.get_xticklabels()] == ["delta-rs\nlocal", "delta-spark\nlocal"]
    finally:
        plt.close(fig)
