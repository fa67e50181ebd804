"""Issue 16, scenario 5, small: a full disk (a tmpfs warehouse). bench/chaos_storage.py runs
it and every damaged-state case; the suite's damaged-state case, a deleted streaming
checkpoint, rides in tests/integration/test_chaos.py's job-kills run (one Spark job fewer)."""

from __future__ import annotations

import pytest

from bench.chaos_storage import disk

# Its tests run in a pytest process of their own beside the session's others (tests/background.py):
# about 18 s: clients in process on a filesystem that fills up.
OUT_OF_PROCESS = True


def test_a_full_disk_gives_clear_errors_corrupts_nothing_and_recovers(tmp_path):
    try:
        r = disk(tmp_path, messages=300)
    except RuntimeError as exc:
        if "cannot mount" in str(exc):
            pytest.skip(str(exc))
        raise
    assert r["errors_by_op"]["publish"] > 0 and not r["unclear_errors"], r
    assert "no space left on device" in r["first_error"]
    assert r["unreadable_tables"] == [] and r["missing_published_full"] == 0 and r["backlog_agrees_full"], r
    assert r["maintenance_full"]["traceback"] is False and r["maintenance_after"]["rc"] == 0, r
    assert (r["lost"], r["backlog_after"]) == (0, 0), r
    assert r["unexpected_lines"] == [] and r["ok"]
