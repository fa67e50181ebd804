"""Seek and snapshots (issue 15) on real tables, through the Python client: seek to a time
with and without retention (the subscription's retain_acked_messages, the topic's
retention, the retention window), seek to a snapshot (1,000 acked, then exactly those
redelivered), acks of deliveries made before a seek, filters, ordering keys, the snapshot
admin calls, and the errors, which write nothing."""

from __future__ import annotations

import time
from typing import Iterable

import pytest

from deltabus import PublisherClient, SubscriberClient
from deltabus.errors import AcknowledgeError, AcknowledgeStatus, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from deltabus.types import DAY, PublisherOptions
from tests.conftest import ManualClock, table_versions

P = "local"


def drain(sub: SubscriberClient, name: str, *, ack: bool = True) -> list[bytes]:
    """Every message deliverable now (acked unless told not to), data sorted."""
    got: list[bytes] = []
    while True:
        batch = sub.pull(subscription=name, max_messages=1000, return_immediately=True).received_messages
        if not batch:
            return sorted(got)
        got += [m.message.data for m in batch]
        if ack:
            sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in batch])


def publish(pub: PublisherClient, topic: str, datas: Iterable[str]) -> None:
    pub.publish_batch(topic, [{"data": d.encode()} for d in datas])


def b(*datas: str) -> list[bytes]:
    return sorted(d.encode() for d in datas)


def test_seek_to_a_time_without_retention_only_acks_what_came_before(pub, sub, topic) -> None:
    name = sub.subscription_path(P, "plain")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["a1", "a2"])
    assert drain(sub, name) == b("a1", "a2")  # acked
    publish(pub, topic, ["b1", "b2"])
    assert drain(sub, name, ack=False) == b("b1", "b2")  # leased, unacked
    mid = time.time()
    publish(pub, topic, ["c1", "c2"])  # not fanned out yet
    sub.seek(request={"subscription": name, "time": mid})
    # Acked messages are gone without retention; unacked ones before the time count as acked.
    assert drain(sub, name) == b("c1", "c2")
    sub.seek(request={"subscription": name, "time": 0})
    assert drain(sub, name) == []


def test_seek_back_with_retain_acked_replays_acked_messages_published_since(pub, sub, topic) -> None:
    name = sub.subscription_path(P, "retained")
    sub.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True})
    publish(pub, topic, ["old1", "old2"])
    assert drain(sub, name) == b("old1", "old2")
    mid = time.time()
    publish(pub, topic, ["new1", "new2", "new3"])
    assert drain(sub, name) == b("new1", "new2", "new3")
    sub.seek(subscription=name, time=mid)
    assert drain(sub, name) == b("new1", "new2", "new3")
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == b("old1", "old2", "new1", "new2", "new3")
    sub.seek(subscription=name, time=time.time() + 60)  # the future: everything counts as acked
    assert drain(sub, name) == []
    publish(pub, topic, ["later"])
    assert drain(sub, name) == b("later")  # published after the seek: delivered as usual


def test_the_retention_window_bounds_what_comes_back(warehouse, topic) -> None:
    clock = ManualClock(time.time())
    pub = PublisherClient(warehouse=warehouse, clock=clock)  # publish times on the same clock
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    name = sub.subscription_path(P, "window")
    sub.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True,
                                     "message_retention_duration": 3600})
    publish(pub, topic, ["early"])
    assert drain(sub, name) == b("early")
    clock.advance(3000)
    late = clock()
    publish(pub, topic, ["late"])
    assert drain(sub, name) == b("late")
    clock.advance(1200)  # "early" is now past the hour of retention
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == b("late")
    sub.seek(subscription=name, time=late + 1)
    assert drain(sub, name) == []
    sub.close()
    pub.close()


def test_topic_retention_reaches_back_before_the_subscription_existed(pub, sub) -> None:
    topic = pub.topic_path(P, "kept")
    made = pub.create_topic(request={"name": topic, "message_retention_duration": 2 * DAY})
    assert made.message_retention_duration == 2 * DAY == pub.get_topic(topic=topic).message_retention_duration
    publish(pub, topic, ["before1", "before2"])
    name = sub.subscription_path(P, "late-comer")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["after"])
    assert drain(sub, name) == b("after")
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == b("before1", "before2", "after")
    # Without topic retention (updated away), and without retain_acked: nothing comes back.
    pub.update_topic(topic={"name": topic}, update_mask=["message_retention_duration"])
    assert pub.get_topic(topic=topic).message_retention_duration is None
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == []


def test_a_snapshot_then_1000_acked_then_a_seek_to_it_redelivers_exactly_those(pub, sub, topic) -> None:
    name = sub.subscription_path(P, "snapped")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["acked-before"])
    assert drain(sub, name) == b("acked-before")
    datas = [f"m{i:04d}" for i in range(1000)]
    for i in range(0, 1000, 250):
        publish(pub, topic, datas[i:i + 250])
    snap = sub.snapshot_path(P, "before-the-acks")
    made = sub.create_snapshot(name=snap, subscription=name)
    assert made.topic == topic and made.expire_time is not None
    assert drain(sub, name) == b(*datas)  # the 1,000 acked
    publish(pub, topic, ["after-snapshot"])
    sub.seek(subscription=name, snapshot=snap)
    again = drain(sub, name)
    assert again == b(*datas, "after-snapshot")  # exactly those 1,000, and what came after the snapshot
    assert drain(sub, name) == []


def test_an_ack_of_a_delivery_made_before_the_seek_does_not_take_the_message_out(pub, sub, topic) -> None:
    name = sub.subscription_path(P, "stale-acks")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["x", "y"])
    held = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
    assert len(held) == 2
    snap = sub.snapshot_path(P, "held")
    sub.create_snapshot(name=snap, subscription=name)
    sub.seek(subscription=name, snapshot=snap)
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in held])  # stale: ignored
    sub.modify_ack_deadline(subscription=name, ack_ids=[m.ack_id for m in held], ack_deadline_seconds=600)
    assert drain(sub, name) == b("x", "y")  # redelivered at once (the seek ended the leases)


def test_a_seek_keeps_to_the_subscription_filter(pub, sub, topic) -> None:
    name = sub.subscription_path(P, "filtered")
    sub.create_subscription(request={"name": name, "topic": topic, "filter": 'attributes.kind = "keep"',
                                     "retain_acked_messages": True})
    pub.publish_batch(topic, [{"data": b"k1", "attributes": {"kind": "keep"}}, {"data": b"d1", "attributes": {"kind": "drop"}}])
    assert drain(sub, name) == [b"k1"]
    snap = sub.snapshot_path(P, "filtered-snap")
    other = sub.subscription_path(P, "unfiltered")
    sub.create_subscription(name=other, topic=topic)
    pub.publish_batch(topic, [{"data": b"k2", "attributes": {"kind": "keep"}}, {"data": b"d2", "attributes": {"kind": "drop"}}])
    sub.create_snapshot(name=snap, subscription=other)  # holds k2 and d2 unacked
    sub.seek(subscription=name, time=0)
    assert drain(sub, name) == [b"k1", b"k2"]
    sub.seek(subscription=name, snapshot=snap)  # another subscription's snapshot: the filter still applies
    assert drain(sub, name) == [b"k2"]


def test_replayed_messages_of_a_key_come_in_publish_order(warehouse, sub) -> None:
    pub = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    topic = pub.topic_path(P, "ordered")
    pub.create_topic(name=topic)
    name = sub.subscription_path(P, "ordered-sub")
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True,
                                     "retain_acked_messages": True})
    for i in range(6):
        pub.publish(topic, f"k{i}".encode(), ordering_key="key").result()
    first = sub.pull(subscription=name, max_messages=2, return_immediately=True).received_messages
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in first])  # k0, k1 acked; k2.. unacked
    sub.seek(subscription=name, time=0)
    order: list[bytes] = []
    while True:
        got = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        if not got:
            break
        order += [m.message.data for m in got]
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
    assert order == [f"k{i}".encode() for i in range(6)]
    pub.close()


def test_snapshot_admin_calls(sub, topic) -> None:
    name = sub.subscription_path(P, "admin")
    sub.create_subscription(name=name, topic=topic)
    one, two = sub.snapshot_path(P, "snap-one"), sub.snapshot_path(P, "snap-two")
    sub.create_snapshot(request={"name": one, "subscription": name, "labels": {"team": "data"}})
    sub.create_snapshot(name=two, subscription=name)
    assert sub.get_snapshot(snapshot=one).labels == {"team": "data"}
    assert [s.name for s in sub.list_snapshots(project=P)] == [one, two]
    pages = list(sub.list_snapshots(request={"project": f"projects/{P}", "page_size": 1}).pages)
    assert [[s.name for s in p.snapshots] for p in pages] == [[one], [two]]
    updated = sub.update_snapshot(snapshot={"name": one, "labels": {"team": "ops"}}, update_mask=["labels"])
    assert updated.labels == {"team": "ops"} == sub.get_snapshot(snapshot=one).labels
    with pytest.raises(AlreadyExists):
        sub.create_snapshot(name=one, subscription=name)
    sub.delete_snapshot(snapshot=one)
    with pytest.raises(NotFound):
        sub.get_snapshot(snapshot=one)
    with pytest.raises(NotFound):
        sub.delete_snapshot(snapshot=one)
    with pytest.raises(NotFound):
        sub.seek(subscription=name, snapshot=one)
    assert [s.name for s in sub.list_snapshots(project=P)] == [two]


def test_bad_requests_name_the_field_and_write_nothing(pub, sub, topic, warehouse) -> None:
    name = sub.subscription_path(P, "checked")
    sub.create_subscription(name=name, topic=topic)
    other_topic = pub.topic_path(P, "elsewhere")
    pub.create_topic(name=other_topic)
    foreign = sub.subscription_path(P, "foreign")
    sub.create_subscription(name=foreign, topic=other_topic)
    snap = sub.snapshot_path(P, "of-elsewhere")
    sub.create_snapshot(name=snap, subscription=foreign)
    publish(pub, topic, ["m"])
    before = table_versions(warehouse)
    cases = [
        (lambda: sub.seek(subscription=name), "seek: give exactly one of time and snapshot"),
        (lambda: sub.seek(subscription=name, time=0, snapshot=snap), "seek: give exactly one"),
        (lambda: sub.seek(subscription=name, time="yesterday"), "time: must be an RFC 3339 time"),
        (lambda: sub.seek(subscription=name, snapshot=snap), "snapshot: .*is a snapshot of topic"),
        (lambda: sub.seek(subscription=name, snapshot="projects/local/topics/nope"), "snapshot: .*projects/PROJECT/snapshots/ID"),
        (lambda: sub.create_snapshot(name="bad name", subscription=name), "name: "),
        (lambda: sub.create_snapshot(request={"name": sub.snapshot_path(P, "lab"), "subscription": name, "labels": {"Bad": "x"}}),
         "labels"),
        (lambda: sub.update_snapshot(snapshot={"name": snap}, update_mask=["expire_time"]), "update_mask: cannot update"),
        (lambda: sub.create_subscription(request={"name": sub.subscription_path(P, "short"), "topic": topic,
                                                  "message_retention_duration": 60}),
         r"message_retention_duration: must be 10 minutes\.\.7 days"),
        (lambda: pub.create_topic(request={"name": pub.topic_path(P, "long"), "message_retention_duration": 40 * DAY}),
         r"message_retention_duration: must be 10 minutes\.\.31 days"),
    ]
    for call, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            call()
    assert table_versions(warehouse) == before


def test_a_detached_subscription_takes_no_seek_and_no_snapshot(pub, sub, topic) -> None:
    name = sub.subscription_path(P, "gone-away")
    sub.create_subscription(name=name, topic=topic)
    pub.detach_subscription(subscription=name)
    with pytest.raises(FailedPrecondition):
        sub.seek(subscription=name, time=0)
    with pytest.raises(FailedPrecondition):
        sub.create_snapshot(name=sub.snapshot_path(P, "of-detached"), subscription=name)


def test_a_snapshot_that_would_expire_within_the_hour_is_refused(pub, warehouse, topic) -> None:
    clock = ManualClock(time.time())
    sub = SubscriberClient(warehouse=warehouse, clock=clock)
    name = sub.subscription_path(P, "stale-backlog")
    sub.create_subscription(name=name, topic=topic)
    published = time.time()
    publish(pub, topic, ["ancient"])
    clock.advance(7 * DAY - 1800)  # the oldest unacked message is 6.5 days + old: half an hour left
    with pytest.raises(FailedPrecondition, match="expire in 30 minutes"):
        sub.create_snapshot(name=sub.snapshot_path(P, "too-late"), subscription=name)
    clock.advance(-DAY)
    made = sub.create_snapshot(name=sub.snapshot_path(P, "in-time"), subscription=name)
    assert made.expire_time is not None
    assert made.expire_time.timestamp() == pytest.approx(published + 7 * DAY, abs=5)  # 7 days after "ancient"
    sub.close()


def test_an_old_ack_id_never_acks_a_message_the_seek_brought_back(pub, sub, topic) -> None:
    """The message is acked, then brought back as a new row whose attempts restart at 1: a
    late duplicate of the old ack (same attempt) must not ack the replay."""
    name = sub.subscription_path(P, "dup-acks")
    sub.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True,
                                     "enable_exactly_once_delivery": True})
    publish(pub, topic, ["once"])
    (old,) = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
    sub.acknowledge(subscription=name, ack_ids=[old.ack_id])
    sub.seek(subscription=name, time=0)
    (new,) = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
    assert new.delivery_attempt == old.delivery_attempt == 1 and new.ack_id != old.ack_id
    with pytest.raises(AcknowledgeError) as e:
        sub.acknowledge(subscription=name, ack_ids=[old.ack_id])
    assert e.value.failed == {old.ack_id: AcknowledgeStatus.INVALID_ACK_ID}
    sub.acknowledge(subscription=name, ack_ids=[new.ack_id])
    assert drain(sub, name) == []


def test_an_old_ack_id_of_a_later_attempt_does_not_beat_the_current_one(pub, sub, topic) -> None:
    """Before the seek the message was delivered twice (attempt 2 acked); brought back, its
    new delivery is attempt 1 of a lower version. Both ids in one call: the current applies."""
    name = sub.subscription_path(P, "old-attempts")
    sub.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True,
                                     "enable_exactly_once_delivery": True})
    publish(pub, topic, ["m"])
    (first,) = sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
    sub.modify_ack_deadline(subscription=name, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    (second,) = sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
    sub.acknowledge(subscription=name, ack_ids=[second.ack_id])
    sub.seek(subscription=name, time=0)
    (again,) = sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
    assert (second.delivery_attempt, again.delivery_attempt) == (2, 1)
    with pytest.raises(AcknowledgeError) as e:
        sub.acknowledge(subscription=name, ack_ids=[again.ack_id, second.ack_id])
    assert e.value.failed == {second.ack_id: AcknowledgeStatus.INVALID_ACK_ID}  # the current one applied
    assert drain(sub, name) == []
