"""Issue 16, scenarios 5 and 6, small: a full disk (a tmpfs warehouse) and damaged state
(the push job's streaming checkpoint deleted). bench/chaos_storage.py runs every case."""

from __future__ import annotations

import pytest

from bench.chaos_storage import damaged, disk


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


@pytest.mark.spark
def test_a_deleted_streaming_checkpoint_loses_nothing(tmp_path):
    r = damaged(tmp_path, messages=20, steps_wanted=("checkpoint deleted",))
    assert [s["job_rc"] for s in r["steps"]] == [0, 0], r["steps"]
    # The new checkpoint's batches (ids from 0 again) are its own, not the old one's replays.
    assert r["steps"][1]["skipped_batches"] == 0, r["steps"]
    assert (r["lost"], r["pull_lost"], r["acked_then_redelivered"], r["unknown_ids"]) == (0, 0, 0, 0), r
    assert (r["backlog_push"], r["backlog_pull"]) == (0, 0)
    assert r["ok"], r
