"""storage.maintenance's log cleanup rules (pure): which _delta_log files may go, and when."""

from __future__ import annotations

import pytest

from deltabus.storage.maintenance import LogCleanup, expired_log_cleanup, expired_log_files

NOW = 1_800_000_000.0
OLD, NEW = NOW - 3600, NOW - 10


def v(n: int) -> str:
    return f"{n:020d}"


def test_only_old_files_of_versions_before_an_old_enough_checkpoint_go() -> None:
    files = [
        (f"{v(98)}.json", OLD), (f"{v(98)}.crc", OLD), (f"{v(99)}.json", OLD),
        (f"{v(99)}.checkpoint.parquet", OLD),  # the latest checkpoint itself stays
        (f"{v(49)}.checkpoint.parquet", OLD),  # an older one goes
        (f"{v(49)}.checkpoint.0000000001.0000000002.parquet", OLD),  # multi-part
        (f"{v(10)}.{v(20)}.compacted.json", OLD),
        (f"{v(10)}.{v(120)}.compacted.json", OLD),  # reaches past the checkpoint: stays
        (f"{v(97)}.json", NEW),  # too young (a writer's snapshot may still need it)
        (f"{v(100)}.json", OLD),  # after the checkpoint
        ("_last_checkpoint", OLD), ("notes.txt", OLD), (f"{v(5)}.json.tmp", OLD),
    ]
    got = expired_log_files(files, now=NOW, keep_seconds=900)
    assert sorted(got) == sorted([
        f"{v(98)}.json", f"{v(98)}.crc", f"{v(49)}.checkpoint.parquet",
        f"{v(49)}.checkpoint.0000000001.0000000002.parquet", f"{v(10)}.{v(20)}.compacted.json",
    ])
    assert expired_log_files(files, now=NOW, keep_seconds=7200) == []
    # A checkpoint younger than the kept time does not count yet: the one before it decides.
    young = [(n, NEW if n == f"{v(99)}.checkpoint.parquet" else t) for n, t in files]
    assert sorted(expired_log_files(young, now=NOW, keep_seconds=900)) == sorted([f"{v(10)}.{v(20)}.compacted.json"])
    assert expired_log_files([(f"{v(5)}.json", OLD)], now=NOW, keep_seconds=900) == []  # no checkpoint: nothing


def test_cleanups_fall_between_checkpoints() -> None:
    c = LogCleanup()
    assert [n for n in range(1, 301) if c.due(n)] == [50, 150, 250]
    assert [n for n in range(1, 31) if LogCleanup(every=10).due(n)] == [5, 15, 25]


def test_delta_rs_expired_log_hook_runs_only_on_checkpoint_versions():
    assert [v for v in range(0, 450) if expired_log_cleanup(v) is None] == [99, 199, 299, 399]
    assert expired_log_cleanup(100) is False and expired_log_cleanup(0) is False
    assert [v for v in range(12) if expired_log_cleanup(v, every=5) is None] == [4, 9]
    assert expired_log_cleanup(7, every=1) is None  # every version: delta-rs's own behaviour
    with pytest.raises(ValueError, match="every"):
        expired_log_cleanup(5, every=0)
