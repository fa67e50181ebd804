"""spark.idle_hint: the idle hint file the push job leaves and its stream source reads."""

from __future__ import annotations

import os

from deltabus.policy.idle_wake import IdleHint
from deltabus.spark import idle_hint

V = {"messages": 7, "subscriptions": 3, "deliveries": 40}


def test_write_then_read_round_trips_and_clear_removes(tmp_path) -> None:
    path = idle_hint.hint_path(str(tmp_path / "ckpt"))
    assert path is not None and path.endswith(idle_hint.FILE_NAME)
    assert idle_hint.read(path) is None  # none yet
    idle_hint.write(path, IdleHint(V, 123.5, 10.0))
    assert idle_hint.read(path) == IdleHint(V, 123.5, 10.0)
    idle_hint.write(path, IdleHint({**V, "messages": 8}, 130.0, 10.0))  # replaced whole
    assert idle_hint.read(path) == IdleHint({**V, "messages": 8}, 130.0, 10.0)
    assert os.listdir(os.path.dirname(path)) == [idle_hint.FILE_NAME]  # no temporary left
    idle_hint.clear(path)
    idle_hint.clear(path)  # (twice: nothing to remove)
    assert idle_hint.read(path) is None


def test_a_malformed_hint_reads_as_none(tmp_path) -> None:
    path = str(tmp_path / idle_hint.FILE_NAME)
    for body in ("", "{", '{"versions": {"messages": 1}, "at": 1, "recheck": 10}', '{"versions": [], "at": 1, "recheck": 10}',
                 '{"versions": {"messages": 1, "subscriptions": 1, "deliveries": 1}, "at": "x", "recheck": 10}'):
        with open(path, "w") as f:
            f.write(body)
        assert idle_hint.read(path) is None, body


def test_file_urls_are_local_and_object_stores_keep_no_hint() -> None:
    assert idle_hint.hint_path("file:///tmp/c") == os.path.join("/tmp/c", idle_hint.FILE_NAME)
    assert idle_hint.hint_path("s3://bucket/c") is None
