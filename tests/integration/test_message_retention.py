"""Message retention in maintenance (issue 15), on real tables with an injected clock:
unacked messages outliving their subscription's retention are dropped, the messages table
loses what no rule keeps, topic retention and snapshots keep what they need, expired
snapshots go, and a 0-hour vacuum request never removes history a snapshot or a cursor
still reads."""

from __future__ import annotations

import time

import pyarrow as pa
from deltalake import DeltaTable

from deltabus import PublisherClient, SubscriberClient, retention
from deltabus.policy.retention import COMMIT_MARGIN, MIN_AGE, message_cutoff
from deltabus.types import DAY
from tests.conftest import ManualClock, delivery_state
from tests.integration.test_seek import b, drain, publish

P = "local"


def message_count(warehouse: str, topic_uid: str) -> int:
    table = pa.table(DeltaTable(f"{warehouse}/messages").to_pyarrow_table(columns=["topic_uid"]))
    return sum(1 for u in table["topic_uid"].to_pylist() if u == topic_uid)


def test_the_cutoff_is_the_longest_rule_and_never_younger_than_an_hour() -> None:
    now = 100 * DAY
    assert message_cutoff(now, topic_retention=None, subscription_retentions=[], kept_since=[]) == now - MIN_AGE
    assert message_cutoff(now, topic_retention=None, subscription_retentions=[600.0, 7 * DAY], kept_since=[]) == now - 7 * DAY
    assert message_cutoff(now, topic_retention=20 * DAY, subscription_retentions=[7 * DAY], kept_since=[]) == now - 20 * DAY
    assert message_cutoff(now, topic_retention=None, subscription_retentions=[600.0], kept_since=[now - 5 * DAY]) == (
        now - 5 * DAY - COMMIT_MARGIN
    )


def test_unacked_messages_past_their_retention_are_dropped_and_the_topic_trimmed(warehouse) -> None:
    clock = ManualClock(time.time())
    pub = PublisherClient(warehouse=warehouse, clock=clock)
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    topic = pub.topic_path(P, "short-lived")
    pub.create_topic(name=topic)
    short, default = sub.subscription_path(P, "ten-minutes"), sub.subscription_path(P, "a-week")
    sub.create_subscription(request={"name": short, "topic": topic, "message_retention_duration": 600})
    sub.create_subscription(name=default, topic=topic)
    publish(pub, topic, ["m1", "m2"])
    assert drain(sub, short, ack=False) == b("m1", "m2")  # leased, never acked
    assert drain(sub, default, ack=False) == b("m1", "m2")
    clock.advance(900)
    publish(pub, topic, ["fresh"])  # not fanned out to either yet: not "unacked in deliveries", so not dropped
    report = retention.apply_retention(sub.engine, clock=clock)
    assert report["unacked_dropped"] == 2  # the ten-minute subscription's two; not "fresh", not the week's
    assert drain(sub, short) == b("fresh")
    uid = sub._registry.topic(topic).topic_uid
    assert message_count(warehouse, uid) == 3  # the week's subscription still holds m1 and m2
    assert drain(sub, default, ack=False) == b("fresh", "m1", "m2")  # its cursor is at the end too now (m1, m2: leases ran out)
    clock.advance(8 * DAY)
    report = retention.apply_retention(sub.engine, clock=clock)
    assert report["unacked_dropped"] == 3 and report["topics_trimmed"] == 1
    assert message_count(warehouse, uid) == 0
    assert drain(sub, default) == []
    publish(pub, topic, ["after"])  # the topic works on
    assert drain(sub, default) == b("after") and drain(sub, short) == b("after")
    sub.close()
    pub.close()


def test_topic_retention_keeps_acked_messages_for_a_seek(warehouse) -> None:
    clock = ManualClock(time.time())
    pub = PublisherClient(warehouse=warehouse, clock=clock)
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    topic = pub.topic_path(P, "kept-long")
    pub.create_topic(request={"name": topic, "message_retention_duration": 20 * DAY})
    name = sub.subscription_path(P, "reader")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["old"])
    assert drain(sub, name) == b("old")
    clock.advance(10 * DAY)
    report = retention.maintain(sub.engine, retention_hours=0, clock=clock)
    assert report  # compacted and vacuumed with a 0-hour request
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == b("old")
    clock.advance(11 * DAY)  # past the topic's 20 days
    retention.apply_retention(sub.engine, clock=clock)
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == []
    sub.close()
    pub.close()


def test_a_snapshot_keeps_its_messages_and_history_through_a_zero_hour_vacuum(warehouse) -> None:
    clock = ManualClock(time.time())
    pub = PublisherClient(warehouse=warehouse, clock=clock)
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    topic = pub.topic_path(P, "snapped-topic")
    pub.create_topic(name=topic)
    name = sub.subscription_path(P, "brief")
    sub.create_subscription(request={"name": name, "topic": topic, "message_retention_duration": 600})
    publish(pub, topic, ["held1", "held2"])
    held = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
    snap = sub.snapshot_path(P, "keeper")
    sub.create_snapshot(name=snap, subscription=name)
    for i in range(4):  # several versions after the snapshot's cursor, each its own file
        publish(pub, topic, [f"after{i}"])
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in held])
    assert drain(sub, name) == b("after0", "after1", "after2", "after3")  # now all six are acked
    clock.advance(2 * 3600)  # past the subscription's ten minutes
    report = retention.maintain(sub.engine, retention_hours=0, clock=clock)
    messages = next(r for r in report if r["table"] == "messages")
    assert messages["files_after"] < messages["files_before"]  # compacted: the old files are only history now
    uid = sub._registry.topic(topic).topic_uid
    assert message_count(warehouse, uid) == 6  # the snapshot keeps them all
    sub.seek(subscription=name, snapshot=snap)  # reads the change feed after the snapshot's cursor
    assert drain(sub, name) == b("held1", "held2", "after0", "after1", "after2", "after3")
    # Once the snapshot is gone, maintenance trims the topic and vacuums that history.
    sub.delete_snapshot(snapshot=snap)
    retention.maintain(sub.engine, retention_hours=0, clock=clock)
    assert message_count(warehouse, uid) == 0
    sub.close()
    pub.close()


def test_expired_snapshots_are_deleted_by_maintenance(warehouse) -> None:
    clock = ManualClock(time.time())
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    pub = PublisherClient(warehouse=warehouse, clock=clock)
    topic = pub.topic_path(P, "t-expiring")
    pub.create_topic(name=topic)
    name = sub.subscription_path(P, "s-expiring")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["x"])
    old = sub.create_snapshot(name=sub.snapshot_path(P, "old"), subscription=name)
    clock.advance(3 * DAY)
    young = sub.create_snapshot(name=sub.snapshot_path(P, "young"), subscription=name)
    assert old.expire_time == young.expire_time  # both end 7 days after "x", their oldest unacked message
    drain(sub, name)
    fresh = sub.create_snapshot(name=sub.snapshot_path(P, "empty"), subscription=name)  # nothing unacked: 7 days from now
    clock.advance(4 * DAY + 60)
    report = retention.apply_retention(sub.engine, clock=clock)
    assert report["snapshots_expired"] == 2
    assert [s.name for s in sub.list_snapshots(project=P)] == [fresh.name]
    engine = sub.engine
    left = engine.snapshot("snapshot_messages").read(columns=["snapshot_uid"])
    assert left.num_rows == 0  # the expired ones' messages went too; "empty" has none
    sub.close()
    pub.close()


def test_maintenance_sweeps_the_rows_of_a_subscription_deleted_halfway(pub, sub, topic, warehouse) -> None:
    """Deleting a subscription is two commits: its registry row, then its rows. A crash
    between them (here: the first commit alone) leaves rows nobody reads; maintenance deletes
    them, and leaves a live subscription's alone."""
    from deltabus.storage.tables import SUBSCRIPTIONS

    gone, kept = sub.subscription_path(P, "half-deleted"), sub.subscription_path(P, "still-here")
    sub.create_subscription(name=gone, topic=topic)
    sub.create_subscription(name=kept, topic=topic)
    publish(pub, topic, ["a", "b"])
    assert drain(sub, gone, ack=False) == b("a", "b") and drain(sub, kept, ack=False) == b("a", "b")
    rec = sub._sub(gone)
    sub._registry._delete_named(SUBSCRIPTIONS.name, "subscription", gone, "sub_uid", rec.sub_uid)  # commit 1 only
    rows = lambda: delivery_state(sub.engine.snapshot("deliveries").read(columns=["sub_uid"]))["sub_uid"].to_pylist()  # noqa: E731
    assert rows().count(rec.sub_uid) == 2
    assert retention.apply_retention(sub.engine, clock=time.time)["deliveries_orphans"] == 1
    assert rec.sub_uid not in rows() and len(rows()) == 2
    assert retention.apply_retention(sub.engine, clock=time.time)["deliveries_orphans"] == 0
