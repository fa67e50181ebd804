"""A push subscription catching up from the change feed fans out whole versions, at most
its limit per batch, on a real delta-rs warehouse (delivery/fanout.py ``catch_up``)."""

from __future__ import annotations

import time

import pyarrow as pa

from deltabus.delivery import fanout
from deltabus.registry import Registry
from deltabus.storage.tables import DELIVERIES, MESSAGES


def _empty_batch() -> pa.Table:
    # The stream's micro-batch of versions first..last; a lagging subscription reads the change feed instead.
    return pa.table({"topic_uid": pa.array([], pa.string()), "message_id": pa.array([], pa.string()),
                     "publish_time": pa.array([], pa.timestamp("us", tz="UTC")), "ordering_key": pa.array([], pa.string()),
                     "size_bytes": pa.array([], pa.int64()), "version": pa.array([], pa.int64())})


def test_a_lagging_subscription_catches_up_in_whole_versions_within_its_limit(pub, sub, topic):
    name = sub.subscription_path("local", "catching-up")
    sub.create_subscription(name=name, topic=topic)
    other = pub.topic_path("local", "other-topic")
    pub.create_topic(name=other)
    sizes = [30, 5, 0, 12, 40, 1, 7, 25]  # messages per version of this topic; 0: a version of another topic
    published: list[str] = []
    for n in sizes:
        if n:
            published += pub.publish_batch(topic, [{"data": b"x"}] * n)
        else:
            pub.publish_batch(other, [{"data": b"y"}] * 3)
    engine = sub.engine
    rec = Registry(engine, clock=time.time).subscription(name)
    last = engine.version(MESSAGES.name)
    first = last  # the stream's batch starts at the end: the subscription lags from its start version
    seen: list[str] = []
    batches = 0
    limit = 20
    while True:
        snap = engine.snapshot(DELIVERIES.name)
        fan = fanout.from_batch(engine, snap, rec, _empty_batch(), first, last, limit=limit)
        if fan.end == fan.cursor:
            break
        versions = fan.rows["message_version"].to_pylist()
        assert max(versions) <= fan.end
        # whole versions, within the limit unless one version alone holds more
        assert fan.rows.num_rows <= limit or len(set(versions)) == 1, (fan.rows.num_rows, set(versions))
        seen += fan.rows["message_id"].to_pylist()
        engine.transact(DELIVERIES.name, lambda s, fan=fan: s.commit_txns(fan.txns(rec.sub_uid)), what="test cursor")
        batches += 1
        assert batches < 20
    assert fan.end == last
    assert seen == published  # every message once, in publish order
    assert batches >= 5  # 120 messages at 20 a batch (40 alone in one)

    # A full window (limit 0) reads nothing and leaves the cursor.
    pub.publish_batch(topic, [{"data": b"z"}] * 3)
    later = engine.version(MESSAGES.name)
    fan = fanout.from_batch(engine, engine.snapshot(DELIVERIES.name), rec, _empty_batch(), later, later, limit=0)
    assert fan.rows.num_rows == 0 and fan.end == fan.cursor == last
    # No limit: the whole range at once, as before.
    fan = fanout.from_batch(engine, engine.snapshot(DELIVERIES.name), rec, _empty_batch(), later, later)
    assert fan.rows.num_rows == 3 and fan.end == later
