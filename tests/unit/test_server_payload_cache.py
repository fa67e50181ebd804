"""server.payload_cache: rows in, the same rows out by (topic, id); the oldest go past the bound."""

from __future__ import annotations

import pytest

from deltabus.publisher.rows import OutgoingMessage, build_rows
from deltabus.server.payload_cache import PayloadCache


def _rows(topic_uid: str, *data: bytes, when: float = 1_700_000_000.0):
    return build_rows(topic_uid, "projects/p/topics/t", [OutgoingMessage(d, {"a": "b"}, "k", len(d) + 2) for d in data], when)


def test_put_then_get_by_topic_and_id() -> None:
    cache = PayloadCache()
    rows, ids = _rows("t1", b"x", b"yy")
    cache.put(rows)
    found, missing = cache.get("t1", [ids[1], "nope", ids[0]])
    assert missing == ["nope"]
    assert found[ids[0]]["data"] == b"x" and found[ids[1]]["data"] == b"yy"
    assert found[ids[0]]["attributes"] == [("a", "b")] and found[ids[0]]["ordering_key"] == "k"
    assert found[ids[0]]["publish_time"].timestamp() == 1_700_000_000.0
    assert cache.get("t2", ids) == ({}, ids)  # another topic's id is not this one's
    assert cache.hits == 2


def test_oldest_rows_go_past_the_bound() -> None:
    first, old_ids = _rows("t", b"a" * 100)
    second, new_ids = _rows("t", b"b" * 100)
    cache = PayloadCache(max_bytes=400)  # two rows of 166 bytes (data, attributes, id twice)
    cache.put(first)
    cache.put(second)
    assert len(cache) == 2
    cache.put(_rows("t", b"c" * 100)[0])
    assert len(cache) == 2 and cache.nbytes <= 400
    assert cache.get("t", old_ids)[1] == old_ids and cache.get("t", new_ids)[1] == []


def test_zero_bound_keeps_nothing_and_a_negative_one_is_refused() -> None:
    cache = PayloadCache(max_bytes=0)
    cache.put(_rows("t", b"a")[0])
    assert len(cache) == 0
    with pytest.raises(ValueError, match="max_bytes"):
        PayloadCache(max_bytes=-1)
