"""Dead-letter topics in the push job (issue 13): a real aiohttp endpoint that always answers
500, real Delta tables, the push workers. The message is pushed exactly
max_delivery_attempts times, then published to the dead-letter topic (with the four
CloudPubSubDeadLetterSource* attributes) and gone from the push subscription."""

from __future__ import annotations

import json
import time

import pytest

from deltabus import config
from deltabus.push.job import DeliveryJob
from deltabus.types import DeadLetterPolicy
from tests.endpoints import Behaviour, Endpoint

pytestmark = pytest.mark.spark

TRIGGER = 0.05


def test_an_always_failing_endpoint_gets_exactly_max_attempts_then_the_message_is_dead_lettered(spark, pub, psub, topic, warehouse):
    dl_topic = pub.topic_path("local", "push-dead-letters")
    pub.create_topic(name=dl_topic)
    dl_sub = psub.subscription_path("local", "push-dead-letters-pull")
    psub.create_subscription(name=dl_sub, topic=dl_topic)
    with Endpoint(Behaviour(lambda r, n: (500, 0.0))) as endpoint:
        s = psub.subscription_path("local", "push-dl")
        psub.create_subscription(request={"name": s, "topic": topic, "push_config": {"push_endpoint": endpoint.url},
                                          "dead_letter_policy": DeadLetterPolicy(dl_topic, 5),
                                          # long enough that the workers' cold start cannot expire the first lease
                                          "ack_deadline_seconds": 60})
        (mid,) = pub.publish_batch(topic, [{"data": b"poison", "attributes": {"a": "1"}}])
        settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=TRIGGER, backlog_interval=5.0,
                                   engine="delta-rs")
        job = DeliveryJob(spark, settings)
        copies = []
        try:
            for batch in range(1, 600):
                job.process(None, batch)
                copies = psub.pull(subscription=dl_sub, max_messages=5, return_immediately=True).received_messages
                if copies:
                    break
                time.sleep(TRIGGER)
            for batch in range(600, 610):  # a few more batches: nothing more is pushed
                job.process(None, batch)
        finally:
            job.close()
    bodies = [json.loads(r.body) for r in endpoint.snapshot()]
    assert [b["deliveryAttempt"] for b in bodies] == [1, 2, 3, 4, 5]
    assert {b["message"]["messageId"] for b in bodies} == {mid}
    (copy,) = copies
    attrs = copy.message.attributes
    assert copy.message.data == b"poison" and attrs["a"] == "1"
    assert attrs["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert attrs["CloudPubSubDeadLetterSourceSubscription"] == "push-dl"
    assert attrs["CloudPubSubDeadLetterSourceSubscriptionProject"] == "local"
    assert attrs["CloudPubSubDeadLetterSourceTopicPublishTime"] == bodies[0]["message"]["publishTime"]
    assert psub.get_backlog(s).num_unacked_messages == 0
