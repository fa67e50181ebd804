"""bench/server.py, the server section of bench/run.sh: a tiny smoke of the whole harness
against a real `deltabus serve` subprocess with the real google-cloud-pubsub client (the
emulator path given as missing, so the run records it and goes on with deltabus alone),
the emulator's own start and stop when it is installed, and the section's place in the
command line (its own results of record). No speed is asserted: the figures are the bench's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import server
from bench.run import RESULTS, figure, parse_args, result_stem
from tests.conftest import ROOT
from tests.integration.test_bench_cli import DAY

# Small enough for ~15 s on a busy 2-core machine: 4 groups of subscriber processes are spawned.
TINY = server.Sizes(publish=200, pull=100, rate=50.0, seconds=0.5, warmup=0.0, clients=2, warm=10, phase_timeout=60.0)


def test_the_harness_against_deltabus_serve_alone_when_the_emulator_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "no-emulator" / "cloud-pubsub-emulator"
    result = server.run(TINY, tmp_path, emulator=missing)

    assert result["servers"]["emulator"] == {"error": f"not installed: {missing} is missing"}
    assert len(result["code"]["commit"]) == 40  # the figures name the code they measured
    d = result["servers"]["deltabus"]
    assert "failed" not in d, d.get("failed")
    assert d["exit"] == 0  # it stopped cleanly on SIGTERM
    assert d["publish"]["messages"] == 200 and d["publish"]["msgs_per_s"] > 0
    # every publish commits to the messages table
    assert d["publish"]["commits"]["messages"]["commits"] >= 2  # 200 messages in batches of at most 100
    for key, clients in (("pull_1", 1), ("pull_2", 2)):
        pulled = d[key]
        assert pulled["complete"], pulled
        assert pulled["unique_messages"] == 100 and pulled["acks_confirmed"] >= 100
        assert pulled["deliveries_left"] == 0  # every ack is on the table
        assert len(pulled["per_client_callbacks"]) == clients
        merges = pulled["commits"]["deliveries"]
        assert merges["commits"] >= 1 and "MERGE" in merges, merges
        assert pulled["server_cpu_s"] > 0
    for key in ("latency_1", "latency_2"):
        lat = d[key]
        assert lat["messages"] > 0 and lat["received"] == lat["messages"], lat
        assert lat["p50_s"] is not None and 0 <= lat["p50_s"] <= lat["p99_s"]
    assert result["ratios"]["publish"] is None and result["ratios"]["pull_2"] is None  # no emulator, no ratio
    assert result["ratios"]["latency_1_p99_target_met"] in (True, False)

    lines = server.table(result).splitlines()
    assert len(lines) == 7 and lines[2].startswith("| publish, 200 × 512 B") and "| – |" in lines[2]

    import matplotlib.pyplot as plt

    fig = figure({"results": {"server": result}})
    try:
        assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
            "official client, 512 B messages", "publish -> callback at 50 msg/s"]
        assert all(ax.get_xlabel() and ax.get_ylabel() and ax.has_data() for ax in fig.axes)
    finally:
        plt.close(fig)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["deltabus-serve.log"]


@pytest.mark.skipif(not server.EMULATOR.exists(), reason=f"Google's Pub/Sub emulator is not installed ({server.EMULATOR})")
def test_the_emulator_starts_on_a_free_port_answers_the_client_and_stops(tmp_path: Path) -> None:
    emulator = server.EmulatorServer(tmp_path)
    try:
        pub = server.publisher(emulator.host)
        pub.create_topic(name=server.topic_path("tiny"))
        assert pub.publish(server.topic_path("tiny"), b"x").result(timeout=30)
        pub.stop()
        assert emulator.cpu() > 0
    finally:
        emulator.stop()
    assert emulator.proc.poll() is not None


def test_the_server_section_runs_only_when_named_and_has_its_own_record(capsys: pytest.CaptureFixture[str]) -> None:
    assert "server" not in parse_args([]).sections
    record = parse_args(["--only", "server"])
    assert record.of_record and result_stem(record, DAY) == RESULTS / "2026-11-23-server"
    quick = result_stem(parse_args(["--quick", "--only", "server"]), DAY)
    assert quick == RESULTS / "2026-11-23-server-quick"
    assert subprocess.run(["git", "check-ignore", "-q", f"{quick.relative_to(ROOT)}.json"], cwd=ROOT).returncode == 0
    assert subprocess.run(["git", "check-ignore", "-q", "bench/results/2026-11-23-server.json"], cwd=ROOT).returncode == 1
    assert result_stem(parse_args(["--only", "server,engines"]), DAY) == RESULTS / "2026-11-23-partial-engines+server"
    for argv in (["--quick", "--only", "server"], ["--only", "engines"], []):  # only a server run writes its record
        with pytest.raises(SystemExit):
            parse_args([*argv, "--out", str(RESULTS / "2026-11-23-server")])
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--only", "server", "--engine", "delta-spark"])
    assert exit_.value.code == 2
    assert "--engine" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("publish", 0), ("clients", 1.5), ("rate", 0), ("warmup", -1), ("seconds", 0)])
def test_sizes_refuse_what_cannot_run(field: str, value: object) -> None:
    fields = {f: getattr(TINY, f) for f in TINY.__dataclass_fields__}
    with pytest.raises(ValueError, match=field):
        server.Sizes(**{**fields, field: value})
