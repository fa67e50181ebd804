"""server/ack_journal.py: the journal of acks answered before their commit, on real files."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path

import pytest

from deltabus.server.ack_journal import SUFFIX, AckJournal, recover


def _lines(path: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in Path(path).read_bytes().splitlines()]


def test_a_line_is_on_disk_when_its_record_returns_and_the_file_empties_once_all_are_committed(tmp_path: Path) -> None:
    j = AckJournal(str(tmp_path / "acks"))
    try:
        j.record("projects/p/subscriptions/s", ["a1", "a2"]).result()
        j.record("projects/p/subscriptions/t", ["b1"]).result()
        assert _lines(j.path) == [{"subscription": "projects/p/subscriptions/s", "ack_ids": ["a1", "a2"]},
                                  {"subscription": "projects/p/subscriptions/t", "ack_ids": ["b1"]}]
        assert stat.S_IMODE(os.stat(j.path).st_mode) == 0o600
        j.committed()
        j.record("projects/p/subscriptions/s", ["a3"]).result()
        assert len(_lines(j.path)) == 3  # one line is still outstanding: nothing is dropped
        j.committed()
        j.committed()
        j.record("x", ["c"]).result()  # (runs after the commits: the journal's one thread keeps order)
        assert _lines(j.path) == [{"subscription": "x", "ack_ids": ["c"]}]
        assert j.lines == 4
    finally:
        j.close()
    assert os.path.exists(j.path)  # closed with a line outstanding: left for recover


def test_close_deletes_the_file_when_every_line_was_committed(tmp_path: Path) -> None:
    j = AckJournal(str(tmp_path))
    j.record("s", ["a"]).result()
    j.committed()
    j.close()
    assert not os.path.exists(j.path)


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
    assert not any(n.endswith(SUFFIX) for n in os.listdir(d))
    assert recover(d, lambda s, ids: applied.append((s, ids))) == 0


def test_recover_leaves_a_live_server_s_journal_alone(tmp_path: Path) -> None:
    d = str(tmp_path)
    live = AckJournal(d)
    try:
        live.record("s", ["a"]).result()
        assert recover(d, lambda s, ids: pytest.fail("a live server's journal was applied")) == 0
        assert os.path.exists(live.path)
    finally:
        live.close()


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
    gone.close()

    def broken(s: str, ids: list[str]) -> None:
        raise OSError("storage away")

    with pytest.raises(OSError):
        recover(d, broken)
    assert os.path.exists(gone.path)
    fd = os.open(gone.path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the failed recover released its lock
    finally:
        os.close(fd)
    assert recover(d, lambda s, ids: None) == 1


def test_a_missing_directory_has_nothing_to_recover(tmp_path: Path) -> None:
    assert recover(str(tmp_path / "none"), lambda s, ids: pytest.fail("nothing to apply")) == 0
