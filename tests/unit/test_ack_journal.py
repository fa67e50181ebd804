"""server/ack_journal.py: the journal of acks answered before their commit, on real files."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path

import pytest

from deltabus.server import ack_journal
from deltabus.server.ack_journal import SUFFIX, AckJournal, recover


def _lines(path: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in Path(path).read_bytes().splitlines()]


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_a_line_is_on_disk_when_its_record_returns_and_the_file_empties_once_all_are_committed(tmp_path: Path) -> None:
    j = AckJournal(str(tmp_path / "acks"))
    try:
        (path,) = j.paths
        assert j.record("projects/p/subscriptions/s", ["a1", "a2"]).result() == 0
        j.record("projects/p/subscriptions/t", ["b1"]).result()
        assert _lines(path) == [{"subscription": "projects/p/subscriptions/s", "ack_ids": ["a1", "a2"]},
                                {"subscription": "projects/p/subscriptions/t", "ack_ids": ["b1"]}]
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "acks").st_mode) == 0o700
        j.committed(0)
        j.record("projects/p/subscriptions/s", ["a3"]).result()
        assert len(_lines(path)) == 3  # one line is still outstanding: nothing is dropped
        j.committed(0)
        j.committed(0)
        j.record("x", ["c"]).result()  # (runs after the commits: the journal's one thread keeps order)
        assert _lines(path) == [{"subscription": "x", "ack_ids": ["c"]}]
        assert j.lines == 4
    finally:
        j.close()
    assert os.path.exists(path)  # closed with a line outstanding: left for recover


def test_under_steady_load_full_segments_go_once_their_lines_are_committed(tmp_path: Path) -> None:
    """Some line is always outstanding (as under steady acking): the newest segment never
    empties, but the journal still does not grow: a segment past the size gets a successor
    and goes when all of its lines are committed."""
    d = tmp_path / "acks"
    j = AckJournal(str(d), segment_bytes=200)
    try:
        prev = j.record("s", ["a" * 50]).result()
        segments = {prev}
        for i in range(200):
            seg = j.record("s", [f"{i:060d}"]).result()
            segments.add(seg)
            j.committed(prev)  # the line before commits after the next one is written
            prev = seg
        j.record("s", ["z"]).result()  # (after the commits above)
        assert len(segments) > 50
        assert len(_files(d)) <= 2  # the newest, and at most the one whose last line is out
        assert sum((d / name).stat().st_size for name in _files(d)) < 1000  # of ~18 KB written
        assert all(name.endswith(SUFFIX) for name in _files(d))
    finally:
        j.close()


def test_close_deletes_the_files_whose_lines_were_all_committed(tmp_path: Path) -> None:
    j = AckJournal(str(tmp_path))
    j.record("s", ["a"]).result()
    j.committed(0)
    j.close()
    assert _files(tmp_path) == []
    j.committed(0)  # a round finishing after the stop: nothing happens
    with pytest.raises(RuntimeError):
        j.record("s", ["b"]).result()


def test_recover_applies_the_journals_of_servers_that_are_gone_and_deletes_them(tmp_path: Path) -> None:
    d = str(tmp_path)
    gone = AckJournal(d)
    gone.record("s1", ["a", "b"]).result()
    gone.record("s2", ["c"]).result()
    gone.record("s1", ["d"]).result()
    gone.close()  # outstanding lines: the file stays, unlocked (as a SIGKILL leaves it)
    applied: list[tuple[str, list[str]]] = []
    assert recover(d, lambda s, ids: applied.append((s, ids))) == 4
    assert applied == [("s1", ["a", "b", "d"]), ("s2", ["c"])]
    assert _files(tmp_path) == []
    assert recover(d, lambda s, ids: applied.append((s, ids))) == 0


def test_recover_applies_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ack_journal, "RECOVER_CHUNK", 2)
    gone = AckJournal(str(tmp_path))
    gone.record("s", ["a", "b", "c"]).result()
    gone.record("s", ["d", "e"]).result()
    gone.close()
    applied: list[list[str]] = []
    assert recover(str(tmp_path), lambda s, ids: applied.append(ids)) == 5
    assert applied == [["a", "b"], ["c", "d"], ["e"]]


def test_recover_leaves_a_live_server_s_journal_alone_and_a_new_one_is_locked_before_it_is_seen(tmp_path: Path) -> None:
    d = str(tmp_path)
    live = AckJournal(d)
    try:
        live.record("s", ["a"]).result()
        assert recover(d, lambda s, ids: pytest.fail("a live server's journal was applied")) == 0
        assert all(os.path.exists(p) for p in live.paths)
        live.committed(0)
    finally:
        live.close()
    assert _files(tmp_path) == []
    # a crash between creating a segment and renaming it leaves a temporary file, usually
    # empty; one that holds lines (its rename lost to a power loss) is applied like any other
    (tmp_path / f"x{ack_journal._TEMP}").write_bytes(b"")
    (tmp_path / f"y{ack_journal._TEMP}").write_bytes(b'{"subscription":"s","ack_ids":["a"]}\n')
    applied: list[tuple[str, list[str]]] = []
    assert recover(d, lambda s, ids: applied.append((s, ids))) == 1
    assert applied == [("s", ["a"])]
    assert _files(tmp_path) == []


def test_a_line_cut_by_a_crash_is_skipped_and_a_line_that_does_not_parse_too(tmp_path: Path) -> None:
    d = tmp_path / "acks"
    d.mkdir()
    (d / f"dead{SUFFIX}").write_bytes(
        b'{"subscription":"s","ack_ids":["a"]}\n'
        b'not json\n'
        b'{"subscription":"s","ack_ids":["b"]}\n'
        b'{"subscription":"s","ack_i'  # the write a SIGKILL cut: its client was never answered
    )
    applied: list[tuple[str, list[str]]] = []
    assert recover(str(d), lambda s, ids: applied.append((s, ids))) == 2
    assert applied == [("s", ["a", "b"])]


def test_a_failing_apply_leaves_the_journal_for_the_next_start(tmp_path: Path) -> None:
    d = str(tmp_path)
    gone = AckJournal(d)
    gone.record("s", ["a"]).result()
    (path,) = gone.paths
    gone.close()

    def broken(s: str, ids: list[str]) -> None:
        raise OSError("storage away")

    with pytest.raises(OSError):
        recover(d, broken)
    assert os.path.exists(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the failed recover released its lock
    finally:
        os.close(fd)
    assert recover(d, lambda s, ids: None) == 1


def test_a_missing_directory_has_nothing_to_recover(tmp_path: Path) -> None:
    assert recover(str(tmp_path / "none"), lambda s, ids: pytest.fail("nothing to apply")) == 0


def test_a_new_segment_is_locked_before_a_starting_server_can_see_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another server's recovery running between the create and the rename finds only a
    locked temporary file: it leaves it alone, and the segment lives on under its lock."""
    real = os.rename
    seen: list[list[str]] = []

    def rename_after_a_recovery(src: str, dst: str) -> None:
        seen.append(_files(tmp_path))
        assert recover(str(tmp_path), lambda s, ids: pytest.fail("nothing to apply")) == 0
        real(src, dst)

    monkeypatch.setattr(ack_journal.os, "rename", rename_after_a_recovery)
    j = AckJournal(str(tmp_path))
    try:
        assert seen and all(name.endswith(ack_journal._TEMP) for name in seen[0])
        (path,) = j.paths
        assert os.path.exists(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        monkeypatch.setattr(ack_journal.os, "rename", real)
        j.close()


@pytest.mark.parametrize("error, moot", [
    ("NotFound", True), ("SubscriptionDetached", True), ("topic NotFound", False),
    ("ClockUncertain", False), ("FailedPrecondition", False), ("Aborted", False), ("OSError", False),
])
def test_only_a_subscription_gone_or_detached_makes_a_journaled_ack_moot(error: str, moot: bool) -> None:
    from deltabus import errors
    from deltabus.server.group_commit import ack_moot

    exc = {
        "NotFound": errors.NotFound("subscription", "projects/p/subscriptions/s"),
        "topic NotFound": errors.NotFound("topic", "projects/p/topics/t"),
        "SubscriptionDetached": errors.SubscriptionDetached("projects/p/subscriptions/s"),
        "ClockUncertain": errors.ClockUncertain("the storage clock is uncertain"),
        "FailedPrecondition": errors.FailedPrecondition("x"),
        "Aborted": errors.Aborted("x"),
        "OSError": OSError("x"),
    }[error]
    assert ack_moot(exc) is moot
