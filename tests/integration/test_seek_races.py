"""Races around seek and snapshots found by review (issue 15), on delta-rs: a seek to a
snapshot deleted between its two reads, and a seek that read its subscription before a
detach. Each wrote something wrong before its fix."""

from __future__ import annotations

import time

import pytest

from deltabus import SubscriberClient
from deltabus.delivery import seek as seeking
from deltabus.errors import NotFound, SubscriptionDetached
from deltabus.types import DAY
from tests.integration.test_seek import b, drain, publish

P = "local"


def test_a_seek_to_a_snapshot_deleted_between_its_reads_is_not_found_and_acks_nothing(pub, sub, topic, warehouse) -> None:
    """The seek reads the snapshot's row, then its stored messages. A delete (or maintenance
    expiring it) in between removes the row and then the messages: the seek read none, and
    used to take that for "nothing unacked", dropping the whole backlog."""
    name = sub.subscription_path(P, "racer")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["u1", "u2", "u3"])
    assert drain(sub, name, ack=False) == b("u1", "u2", "u3")
    snap = sub.snapshot_path(P, "going")
    sub.create_snapshot(name=snap, subscription=name)
    other = SubscriberClient(warehouse=warehouse)
    registry = sub._snapshots
    real_get = registry.get

    def get_then_deleted(n: str):  # type: ignore[no-untyped-def]
        rec = real_get(n)
        other.delete_snapshot(snapshot=snap)
        return rec

    registry.get = get_then_deleted  # type: ignore[method-assign]
    try:
        with pytest.raises(NotFound):
            sub.seek(subscription=name, snapshot=snap)
    finally:
        registry.get = real_get  # type: ignore[method-assign]
        other.close()
    rows = sub.engine.snapshot("deliveries").read(columns=["message_id"], partition=sub._sub(name).sub_uid)
    assert rows.num_rows == 3  # nothing was acked


def test_a_seek_that_read_its_subscription_before_a_detach_writes_nothing(pub, sub) -> None:
    topic = pub.topic_path(P, "kept-topic")
    pub.create_topic(request={"name": topic, "message_retention_duration": 2 * DAY})
    name = sub.subscription_path(P, "to-detach")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["a", "b"])
    assert drain(sub, name) == b("a", "b")
    stale = sub._sub(name)  # what the seek read
    pub.detach_subscription(subscription=name)  # commits before the seek does
    with pytest.raises(SubscriptionDetached):
        seeking.seek_to_time(sub.engine, stale, 0, topic=sub._registry.topic(topic), clock=time.time)
    rows = sub.engine.snapshot("deliveries").read(columns=["message_id"], partition=stale.sub_uid)
    assert rows.num_rows == 0  # the detached partition stays empty (retention would have refilled it)
