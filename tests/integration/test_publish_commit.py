"""server.publish_commit on real Delta tables: the Publish requests queued while an append
runs share ONE append; each request stays whole, in arrival order; a request for a missing
topic fails alone; a failing append fails its whole round and writes nothing."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from deltabus.errors import NotFound
from deltabus.publisher.rows import OutgoingMessage
from deltabus.registry import Registry
from deltabus.server.publish_commit import PublishCommits, _Pending, run_round, take_round
from deltabus.storage import open_engine


def _msgs(*data: bytes) -> list[OutgoingMessage]:
    return [OutgoingMessage(d, {"k": "v"}, "", len(d) + 2) for d in data]


def test_take_round_bounds() -> None:
    loop = asyncio.new_event_loop()
    try:
        q = [_Pending("t", _msgs(b"a", b"b"), 10, loop.create_future()) for _ in range(4)]
        assert take_round(q) == 4
        assert take_round(q, max_messages=5) == 2
        assert take_round(q, max_bytes=25) == 2
        assert take_round(q[:1], max_messages=1, max_bytes=1) == 1  # a request larger than the bounds still goes alone
    finally:
        loop.close()


def test_round_is_one_append_and_a_missing_topic_fails_alone(pub, topic, warehouse, clock) -> None:
    engine = open_engine(warehouse, engine="delta-rs")
    registry = Registry(engine, clock=clock)
    before = engine.version("messages")
    a, missing, b = run_round(engine, registry, [(topic, _msgs(b"1", b"2")), ("projects/local/topics/nope", _msgs(b"x")),
                                                 (topic, _msgs(b"3"))], clock)
    assert engine.version("messages") == before + 1
    assert isinstance(missing, NotFound)
    assert isinstance(a, list) and isinstance(b, list)
    assert a + b == sorted(a + b)  # arrival order is id order
    rows = engine.snapshot("messages").read(["message_id", "data"])
    assert sorted(zip(rows["message_id"].to_pylist(), rows["data"].to_pylist())) == list(zip(a + b, [b"1", b"2", b"3"]))


def test_concurrent_requests_share_appends(pub, topic, warehouse, clock) -> None:
    engine = open_engine(warehouse, engine="delta-rs")
    registry = Registry(engine, clock=clock)
    before = engine.version("messages")
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    pool.submit(gate.wait)  # the first round waits behind this: the others queue meanwhile

    async def main() -> list[list[str]]:
        commits = PublishCommits(engine, registry, clock, executor=pool)
        calls = [asyncio.ensure_future(commits.publish(topic, _msgs(b"0")))]
        await asyncio.sleep(0.05)  # its round has started (held by the gate); the next 19 queue behind it
        calls += [asyncio.ensure_future(commits.publish(topic, _msgs(f"{i}".encode()))) for i in range(1, 20)]
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(*calls)
        assert commits.requests == 20 and commits.rounds == 2
        return out

    try:
        ids = asyncio.run(main())
    finally:
        pool.shutdown()
    assert engine.version("messages") == before + 2
    flat = [i for one in ids for i in one]
    # the second round's 19 in arrival order (across rounds the commit version orders them)
    assert len(set(flat)) == 20 and flat[1:] == sorted(flat[1:])


def test_failing_append_fails_the_round_and_writes_nothing(pub, topic, warehouse, clock, monkeypatch) -> None:
    engine = open_engine(warehouse, engine="delta-rs")
    registry = Registry(engine, clock=clock)
    before = engine.version("messages")

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr("deltabus.server.publish_commit.append", broken)

    async def main() -> list[object]:
        with ThreadPoolExecutor(1) as pool:
            commits = PublishCommits(engine, registry, clock, executor=pool)
            return await asyncio.gather(commits.publish(topic, _msgs(b"a")), commits.publish(topic, _msgs(b"b")),
                                        return_exceptions=True)

    assert all(isinstance(r, OSError) for r in asyncio.run(main()))
    assert engine.version("messages") == before


def test_committed_rows_reach_the_cache_as_the_table_has_them(pub, topic, warehouse, clock) -> None:
    from deltabus.delivery.payloads import fetch_messages
    from deltabus.server.payload_cache import PayloadCache

    engine = open_engine(warehouse, engine="delta-rs")
    registry = Registry(engine, clock=clock)
    cache = PayloadCache()
    (ids,) = run_round(engine, registry, [(topic, _msgs(b"1", b"2"))], clock, cache)
    assert isinstance(ids, list)
    found, missing = cache.get(registry.topic(topic).topic_uid, ids)
    assert missing == []
    assert found == fetch_messages(engine, registry.topic(topic).topic_uid, ids)


def test_recorded_versions_fan_out_as_the_change_feed_has_them(pub, topic, subscription, warehouse, clock) -> None:
    """OwnCommits serves the versions a round appended exactly as the change feed reads them
    (with and without attributes), and reads the versions it did not record (another
    writer's) from the change feed."""
    from deltabus.delivery.cursor import read_unfanned
    from deltabus.server.own_commits import OwnCommits

    engine = open_engine(warehouse, engine="delta-rs")
    registry = Registry(engine, clock=clock)
    rec = registry.subscription(subscription)
    own = OwnCommits()
    first = engine.version("messages") + 1
    run_round(engine, registry, [(topic, [OutgoingMessage(b"a", {"k": "1"}, "key", 3)])], clock, None, own)
    pub.publish_batch(topic, [{"data": b"elsewhere", "attributes": {"k": "2"}}])  # not recorded
    run_round(engine, registry, [(topic, _msgs(b"b", b"c"))], clock, None, own)
    last = engine.version("messages")
    assert own.own(first, first) and not own.own(first, last)
    for attributes in (False, True):
        def feed(a: int, b: int) -> object:
            return read_unfanned(engine, rec, a, b, attributes=attributes)

        got = own.fanout(rec.topic_uid, first, last, attributes, feed)  # type: ignore[arg-type]
        want = read_unfanned(engine, rec, first, last, attributes=attributes)
        order = [("message_id", "ascending")]
        assert got.num_rows == 4
        assert got.sort_by(order).to_pylist() == want.sort_by(order).to_pylist()
    assert own.misses == 2 and own.hits == 4  # the other writer's version, twice; ours, twice each
