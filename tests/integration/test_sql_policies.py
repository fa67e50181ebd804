"""The `subscriptions` SQL view shows the delivery policies (issue 13), on both engines'
readers, and a nack delayed by a retry policy shows as nacked in `deliveries`."""

from __future__ import annotations

import pytest

import deltabus.spark
from deltabus.types import DeadLetterPolicy, RetryPolicy

pytestmark = pytest.mark.spark

QUERY = """select name, retry_policy.minimum_backoff, retry_policy.maximum_backoff,
                  dead_letter_policy.dead_letter_topic, dead_letter_policy.max_delivery_attempts,
                  filter, enable_message_ordering
           from subscriptions order by name"""


def test_subscriptions_view_shows_the_policies(spark, pub, sub, topic, subscription, warehouse):
    dead = pub.topic_path("local", "dead")
    pub.create_topic(name=dead)
    name = sub.subscription_path("local", "policies")
    sub.create_subscription(request={
        "name": name, "topic": topic, "retry_policy": RetryPolicy(30, 60), "dead_letter_policy": DeadLetterPolicy(dead, 9),
        "filter": "attributes:kind", "enable_message_ordering": True,
    })
    pub.publish_batch(topic, [{"data": b"x", "attributes": {"kind": "a"}}])
    (got,) = sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
    sub.modify_ack_deadline(subscription=name, ack_ids=[got.ack_id], ack_deadline_seconds=0)  # due again in 30 s

    s = deltabus.spark.session(warehouse, spark=spark)
    expected = [
        (subscription, None, None, None, None, "", False),
        (name, 30.0, 60.0, dead, 9, "attributes:kind", True),
    ]
    assert [tuple(r) for r in s.sql(QUERY).collect()] == expected
    state = s.sql(f"select state, ack_deadline from deliveries where subscription = '{name}'").collect()
    assert [tuple(r) for r in state] == [("nacked", None)]


@pytest.mark.cluster  # the cluster-engine group: delta-spark reads take tens of seconds here
def test_on_delta_spark_the_subscriptions_view_shows_the_same_policies(spark, pub, sub, topic, subscription, warehouse):
    from deltabus.spark.sql import register
    from tests.conftest import requires_delta

    requires_delta(spark)
    dead = pub.topic_path("local", "dead")
    pub.create_topic(name=dead)
    name = sub.subscription_path("local", "policies")
    sub.create_subscription(request={"name": name, "topic": topic, "retry_policy": {"minimum_backoff": 0.5},
                                     "dead_letter_policy": {"dead_letter_topic": dead}, "filter": "attributes:kind"})
    assert register(spark, warehouse, engine="delta-spark") == "delta-spark"
    assert [tuple(r) for r in spark.sql(QUERY).collect()] == [
        (subscription, None, None, None, None, "", False),
        (name, 0.5, 600.0, dead, 5, "attributes:kind", False),
    ]
