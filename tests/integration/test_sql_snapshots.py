"""The `snapshots` SQL view (issue 15): each snapshot with its source subscription and how
many unacked messages it stores, on both engines' readers, read fresh by every query."""

from __future__ import annotations

import pytest

from deltabus.spark.sql import register

pytestmark = pytest.mark.spark

QUERY = """select name, topic, subscription, labels, messages, oldest_publish_time is not null,
                  create_time < expire_time
           from snapshots order by name"""


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.cluster)])
def test_snapshots_view_counts_the_stored_unacked_messages(spark, pub, sub, topic, subscription, warehouse, engine):
    if engine == "delta-spark":  # the cluster-engine group: delta-spark reads take tens of seconds here
        from tests.conftest import requires_delta

        requires_delta(spark)
    pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(3)])
    (first,) = sub.pull(subscription=subscription, max_messages=1, return_immediately=True).received_messages
    sub.acknowledge(subscription=subscription, ack_ids=[first.ack_id])
    two = sub.snapshot_path("local", "two-unacked")
    sub.create_snapshot(request={"name": two, "subscription": subscription, "labels": {"team": "data"}})
    rest = sub.pull(subscription=subscription, max_messages=10, return_immediately=True).received_messages
    sub.acknowledge(subscription=subscription, ack_ids=[r.ack_id for r in rest])
    none = sub.snapshot_path("local", "none-unacked")
    sub.create_snapshot(name=none, subscription=subscription)

    assert register(spark, warehouse, engine=engine) == engine
    assert [tuple(r) for r in spark.sql(QUERY).collect()] == [
        (none, topic, subscription, {}, 0, False, True),
        (two, topic, subscription, {"team": "data"}, 2, True, True),
    ]
    got = spark.sql(f"""select unix_micros(expire_time) expire_us, oldest_publish_time <= create_time oldest_first
                         from snapshots where name = '{two}'""").collect()[0]
    assert got.expire_us == round(sub.get_snapshot(snapshot=two).expire_time.timestamp() * 1e6) and got.oldest_first

    # Every query reads the tables' latest versions: a deleted snapshot is gone, with its messages.
    sub.delete_snapshot(snapshot=two)
    sub.update_snapshot(snapshot={"name": none, "labels": {"env": "dev"}}, update_mask=["labels"])
    assert [tuple(r) for r in spark.sql("select name, labels, messages from snapshots").collect()] == [(none, {"env": "dev"}, 0)]

    # The retention and exactly-once fields in the topics and subscriptions views.
    pub.update_topic(topic={"name": topic, "message_retention_duration": 7200}, update_mask=["message_retention_duration"])
    sub.update_subscription(subscription={"name": subscription, "retain_acked_messages": True, "enable_exactly_once_delivery": True,
                                          "message_retention_duration": 600},
                            update_mask=["retain_acked_messages", "enable_exactly_once_delivery", "message_retention_duration"])
    assert [tuple(r) for r in spark.sql("select name, message_retention_duration from topics").collect()] == [(topic, 7200.0)]
    row = spark.sql("""select retain_acked_messages, enable_exactly_once_delivery, message_retention_duration
                       from subscriptions""").collect()[0]
    assert tuple(row) == (True, True, 600.0)
