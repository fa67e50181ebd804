import time

import pytest

from deltabus import FailedPrecondition, InvalidArgument, NotFound, PublisherClient, SubscriberClient
from tests.conftest import ManualClock, delivery_state, table_versions
from deltabus.storage.arrow import read_table


def pull_all(client, subscription, n=1000):
    return client.pull(subscription=subscription, max_messages=n, return_immediately=True).received_messages


def test_published_message_is_pulled_with_all_fields(pub, sub, topic, subscription):
    mid = pub.publish(topic, b"payload", ordering_key="", color="red").result(timeout=30)
    (r,) = pull_all(sub, subscription)
    assert r.message.message_id == mid
    assert r.message.data == b"payload"
    assert r.message.attributes == {"color": "red"}
    assert r.message.publish_time is not None and r.delivery_attempt == 1
    sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id])
    assert pull_all(sub, subscription) == []


def test_subscription_point(pub, sub, topic):
    pub.publish_batch(topic, [{"data": b"before"}])
    s = sub.subscription_path("local", "late")
    sub.create_subscription(name=s, topic=topic)
    pub.publish_batch(topic, [{"data": b"after"}])
    assert [r.message.data for r in pull_all(sub, s)] == [b"after"]


def test_each_subscription_gets_every_message(pub, sub, topic):
    subs = [sub.subscription_path("local", f"fan-{i}") for i in range(3)]
    for s in subs:
        sub.create_subscription(name=s, topic=topic)
    ids = pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(50)])
    for s in subs:
        got = pull_all(sub, s)
        assert sorted(r.message.message_id for r in got) == sorted(ids)
        sub.acknowledge(subscription=s, ack_ids=[r.ack_id for r in got])
    assert all(pull_all(sub, s) == [] for s in subs)


def test_unacked_message_returns_after_deadline_with_next_attempt(pub, csub, clock, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}])
    (first,) = pull_all(csub, subscription)
    clock.advance(9.9)
    assert pull_all(csub, subscription) == []  # still leased
    clock.advance(0.2)
    (second,) = pull_all(csub, subscription)
    assert second.message.message_id == first.message.message_id
    assert second.delivery_attempt == first.delivery_attempt + 1 == 2
    assert second.ack_id != first.ack_id


def test_max_messages_and_leases_split_between_pulls(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(25)])
    a = pull_all(sub, subscription, 10)
    b = pull_all(sub, subscription, 10)
    c = pull_all(sub, subscription, 10)
    ids = [r.message.message_id for r in a + b + c]
    assert (len(a), len(b), len(c)) == (10, 10, 5)
    assert len(set(ids)) == 25


def test_nack_makes_message_available_at_once(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    got = pull_all(sub, subscription)
    nacked = got[0]
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[nacked.ack_id], ack_deadline_seconds=0)
    (again,) = pull_all(sub, subscription)
    assert again.message.message_id == nacked.message.message_id and again.delivery_attempt == 2


def test_modify_ack_deadline_extends_lease(pub, csub, clock, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}])
    (r,) = pull_all(csub, subscription)
    clock.advance(8)
    csub.modify_ack_deadline(subscription=subscription, ack_ids=[r.ack_id], ack_deadline_seconds=60)
    clock.advance(50)
    assert pull_all(csub, subscription) == []
    clock.advance(11)
    assert len(pull_all(csub, subscription)) == 1


def test_stale_ack_id_neither_acks_nor_extends_later_delivery(pub, csub, clock, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}])
    (first,) = pull_all(csub, subscription)
    clock.advance(11)
    (second,) = pull_all(csub, subscription)
    csub.acknowledge(subscription=subscription, ack_ids=[first.ack_id])  # harmless
    csub.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=600)
    clock.advance(11)
    (third,) = pull_all(csub, subscription)  # not acked, not extended by the stale id
    assert third.delivery_attempt == 3
    csub.acknowledge(subscription=subscription, ack_ids=[third.ack_id])
    clock.advance(700)
    assert pull_all(csub, subscription) == []


def test_ack_after_deadline_before_redelivery_still_acks(pub, csub, clock, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}])
    (r,) = pull_all(csub, subscription)
    clock.advance(30)
    csub.acknowledge(subscription=subscription, ack_ids=[r.ack_id])
    assert pull_all(csub, subscription) == []


def test_acking_unknown_or_twice_is_harmless(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}])
    (r,) = pull_all(sub, subscription)
    sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id, r.ack_id])
    sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id])
    sub.acknowledge(subscription=subscription, ack_ids=["sdeadbeef.123.1"])


def test_blocking_pull_waits_for_a_message(pub, sub, topic, subscription):
    import threading

    timer = threading.Timer(0.5, lambda: pub.publish_batch(topic, [{"data": b"late"}]))
    timer.start()
    got = sub.pull(subscription=subscription, max_messages=5, timeout=20).received_messages
    timer.join()
    assert [r.message.data for r in got] == [b"late"]
    t0 = time.monotonic()
    assert sub.pull(subscription=subscription, max_messages=5, timeout=0.3).received_messages == []
    assert time.monotonic() - t0 >= 0.3


def test_delete_subscription_drops_messages_and_later_calls_are_not_found(pub, sub, topic, subscription, warehouse):
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    (r, _) = pull_all(sub, subscription)
    sub.delete_subscription(subscription=subscription)
    with pytest.raises(NotFound):
        sub.pull(subscription=subscription, max_messages=1, return_immediately=True)
    with pytest.raises(NotFound):
        sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id])
    from deltalake import DeltaTable


    assert delivery_state(read_table(f"{warehouse}/deliveries")).num_rows == 0
    # The same name again is a new subscription: nothing of the old one comes back.
    sub.create_subscription(name=subscription, topic=topic)
    assert pull_all(sub, subscription) == []


def test_deleting_topic_keeps_what_subscriptions_hold(pub, sub, topic, subscription):
    ids = pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(5)])
    pub.delete_topic(topic=topic)
    got = pull_all(sub, subscription)
    assert sorted(r.message.message_id for r in got) == sorted(ids)
    sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in got])
    assert pull_all(sub, subscription) == []


def test_pull_on_push_subscription_is_refused(sub, topic):
    s = sub.subscription_path("local", "pushy")
    sub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": "https://example.com/push"})
    with pytest.raises(FailedPrecondition):
        sub.pull(subscription=s, max_messages=1, return_immediately=True)


@pytest.mark.parametrize(
    "call, kwargs, field",
    [
        ("pull", {"max_messages": 0, "return_immediately": True}, "max_messages"),
        ("pull", {"max_messages": 10_001, "return_immediately": True}, "max_messages"),
        ("pull", {"return_immediately": True}, "max_messages"),
        ("acknowledge", {"ack_ids": []}, "ack_ids"),
        ("acknowledge", {"ack_ids": ["garbage"]}, "ack_ids[0]"),
        ("acknowledge", {"ack_ids": "s1.2.3"}, "ack_ids"),
        ("modify_ack_deadline", {"ack_ids": ["s1.2.3"], "ack_deadline_seconds": 601}, "ack_deadline_seconds"),
        ("modify_ack_deadline", {"ack_ids": ["s1.2.3"], "ack_deadline_seconds": -1}, "ack_deadline_seconds"),
        ("acknowledge", {"ack_ids": [f"s1.2.{2**40}"]}, "ack_ids[0]"),
        ("pull", {"max_messages": 1, "timeout": "x"}, "timeout"),
    ],
)
def test_bad_pull_requests_write_nothing(pub, sub, topic, subscription, warehouse, call, kwargs, field):
    pub.publish_batch(topic, [{"data": b"x"}])
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:
        getattr(sub, call)(subscription=subscription, **kwargs)
    assert e.value.field == field
    assert table_versions(warehouse) == before


def test_backlog_figures(pub, csub, clock, topic, subscription):
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(10)])
    clock.now = time.time()  # the publisher used real time: start the manual clock from it
    b = csub.get_backlog(subscription)
    assert (b.num_undelivered_messages, b.num_outstanding_messages, b.expired_ack_deadlines) == (10, 0, 0)
    got = pull_all(csub, subscription, 4)
    csub.acknowledge(subscription=subscription, ack_ids=[got[0].ack_id])
    b = csub.get_backlog(subscription)
    assert (b.num_undelivered_messages, b.num_outstanding_messages, b.expired_ack_deadlines) == (6, 3, 0)
    clock.advance(20)
    b = csub.get_backlog(subscription)
    assert (b.num_undelivered_messages, b.num_outstanding_messages, b.expired_ack_deadlines) == (6, 0, 3)
    assert 20 <= b.oldest_unacked_message_age <= 21
    (row,) = csub.refresh_backlog()
    assert row.subscription == subscription
    from deltalake import DeltaTable

    stored = read_table(f"{csub.engine.table_uri('backlog')}").to_pylist()
    assert [(r["subscription"], r["num_undelivered_messages"], r["expired_ack_deadlines"]) for r in stored] == [(subscription, 6, 3)]
    csub.refresh_backlog()
    history = read_table(f"{csub.engine.table_uri('backlog_history')}").to_pylist()
    assert [(r["subscription"], r["num_undelivered_messages"]) for r in history] == [(subscription, 6)] * 2


def test_idle_cursor_moves_past_versions_of_other_topics(pub, sub, topic, subscription, warehouse):
    from deltalake import DeltaTable

    from deltabus.delivery.cursor import IDLE_CURSOR_LAG, cursor_app_id

    other = pub.topic_path("local", "other-topic")
    pub.create_topic(name=other)
    for _ in range(IDLE_CURSOR_LAG + 5):
        pub.publish_batch(other, [{"data": b"not for us"}])
    assert pull_all(sub, subscription) == []
    uid = sub._registry.subscription(subscription).sub_uid
    cursor = DeltaTable(f"{warehouse}/deliveries").transaction_version(cursor_app_id(uid))
    assert cursor == DeltaTable(f"{warehouse}/messages").version()
    mid = pub.publish_batch(topic, [{"data": b"ours"}])[0]
    assert [r.message.message_id for r in pull_all(sub, subscription)] == [mid]


def test_extension_cannot_revive_a_nacked_message(pub, csub, clock, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    a, b = pull_all(csub, subscription)
    csub.modify_ack_deadline(subscription=subscription, ack_ids=[a.ack_id], ack_deadline_seconds=0)  # nack
    csub.modify_ack_deadline(subscription=subscription, ack_ids=[a.ack_id], ack_deadline_seconds=600)  # racing extension
    clock.advance(11)  # b's lease ran out, but nobody has taken it: a late extension still holds it
    csub.modify_ack_deadline(subscription=subscription, ack_ids=[b.ack_id], ack_deadline_seconds=600)
    (again,) = pull_all(csub, subscription)
    assert again.message.message_id == a.message.message_id and again.delivery_attempt == 2


def test_backlog_from_file_statistics_matches_the_rows(pub, csub, clock, topic, subscription, warehouse):
    """Counts come from the log's statistics plus the delivered rows only: check them against
    every row, on a partition of several files of which only some were ever delivered."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    for start in range(0, 3000, 1000):
        pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(start, start + 1000)])
        csub.get_backlog(subscription)  # fans each batch out on its own: one more file each
    clock.now = time.time()
    got = pull_all(csub, subscription, 700)
    csub.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in got[:200]])
    clock.advance(5)
    b = csub.get_backlog(subscription)
    uid = csub._registry.subscription(subscription).sub_uid
    dt = DeltaTable(csub.engine.table_uri("deliveries"))
    rows = read_table(csub.engine.table_uri("deliveries")).filter(pc.equal(pc.field("sub_uid"), uid))
    assert len(dt.file_uris()) >= 2
    delivered = rows.filter(pc.greater(rows["delivery_attempt"], 0)).num_rows
    fanned = rows.num_rows + 200  # the 200 acked rows are gone; a pull fans out about what it leases
    assert 700 <= fanned <= 3000
    unfanned = 3000 - fanned  # counted from the change feed
    assert (b.num_undelivered_messages, b.num_outstanding_messages, b.expired_ack_deadlines) == (
        rows.num_rows - delivered + unfanned, 500, 0)
    assert b.num_undelivered_messages == 2300  # 3,000 published, 700 pulled
    oldest = pc.min(rows["publish_time"]).as_py().timestamp()
    assert abs(b.oldest_unacked_message_age - (clock.now - oldest)) < 0.002  # statistics keep milliseconds
