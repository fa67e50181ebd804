"""Retention: vacuum keeps the messages history that subscriptions still have to fan out,
worked out above storage from the cursors read through the engine."""

from __future__ import annotations

import time

from deltalake import DeltaTable

from deltabus import retention
from deltabus.storage.maintenance import maintain_warehouse


def test_hours_to_keep_rounds_the_age_up_and_adds_an_hour():
    assert retention.hours_to_keep(None, 1000.0) == 0
    assert retention.hours_to_keep(1000.0, 1000.0) == 1
    assert retention.hours_to_keep(1000.0, 1000.0 + 1800) == 2
    assert retention.hours_to_keep(1000.0, 1000.0 + 7200) == 3
    assert retention.hours_to_keep(2000.0, 1000.0) == 1  # a clock behind the commit: no negative age


def test_the_oldest_cursor_sets_what_vacuum_keeps(pub, sub, topic, subscription):
    engine = sub.engine
    start = engine.version("messages")
    assert retention.oldest_unfanned_version(engine) == start + 1
    for i in range(3):
        pub.publish_batch(topic, [{"data": f"m{i}".encode()}])
    assert retention.hours_to_keep_for_fan_out(engine, time.time()) == 2  # seconds old: part of an hour, plus one
    got = sub.pull(subscription=subscription, max_messages=10, return_immediately=True).received_messages
    assert len(got) == 3  # fanned out: the cursor reached the end
    assert retention.oldest_unfanned_version(engine) == engine.version("messages") + 1
    assert retention.hours_to_keep_for_fan_out(engine, time.time()) == 0
    an_hour_later = time.time() + 3600
    pub.publish_batch(topic, [{"data": b"late"}])
    assert retention.hours_to_keep_for_fan_out(engine, an_hour_later) == 2


def test_maintain_with_zero_retention_keeps_unfanned_messages_deliverable(pub, sub, topic, subscription):
    published = []
    for i in range(6):
        published += pub.publish_batch(topic, [{"data": f"m{i}".encode()}])
    report = retention.maintain(sub.engine, retention_hours=0, clock=time.time)
    messages = next(r for r in report if r["table"] == "messages")
    assert messages["files_after"] < messages["files_before"]  # compacted; the old files stay for fan-out
    got = sub.pull(subscription=subscription, max_messages=100, return_immediately=True).received_messages
    assert sorted(m.message.message_id for m in got) == sorted(published)


def test_without_the_limit_vacuum_would_delete_what_fan_out_needs(pub, sub, topic, subscription):
    """The counter-test: storage alone (keep_hours={}) vacuums the files the cursor still needs."""
    for i in range(6):
        pub.publish_batch(topic, [{"data": f"m{i}".encode()}])
    report = maintain_warehouse(sub.engine.warehouse, retention_hours=0, keep_hours={})
    assert next(r for r in report if r["table"] == "messages")["vacuumed"] >= 6
    first = retention.oldest_unfanned_version(sub.engine)
    try:
        DeltaTable(sub.engine.table_uri("messages")).load_cdf(starting_version=first).read_all()
    except Exception:
        return  # the change feed of those versions is gone, as expected
    raise AssertionError("the change feed survived a vacuum without the fan-out limit")
