"""The delivery-policy fields of a subscription (issue 13) through the client: create, get,
update (Pub/Sub's mutability), clearing a policy, and bad requests writing nothing."""

from __future__ import annotations

import pytest

from deltabus import InvalidArgument, SubscriberClient
from deltabus.types import DeadLetterPolicy, RetryPolicy, Subscription
from tests.conftest import table_versions


def test_policies_are_created_returned_updated_and_cleared(sub: SubscriberClient, pub, topic):
    dead = pub.topic_path("local", "dead")
    pub.create_topic(name=dead)
    name = sub.subscription_path("local", "with-policies")
    created = sub.create_subscription(request={
        "name": name, "topic": topic, "retry_policy": {"minimum_backoff": 1, "maximum_backoff": 30},
        "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 7},
        "filter": 'attributes:kind', "enable_message_ordering": True,
    })
    assert created == Subscription(
        name=name, topic=topic, enable_message_ordering=True, retry_policy=RetryPolicy(1, 30),
        dead_letter_policy=DeadLetterPolicy(dead, 7), filter="attributes:kind",
    )
    assert sub.get_subscription(subscription=name) == created
    # Updatable: the retry and dead-letter policies; a mask path left unset clears it.
    updated = sub.update_subscription(
        subscription={"name": name, "retry_policy": RetryPolicy(2, 20)}, update_mask=["retry_policy", "dead_letter_policy"]
    )
    assert (updated.retry_policy, updated.dead_letter_policy, updated.filter) == (RetryPolicy(2, 20), None, "attributes:kind")
    assert sub.get_subscription(subscription=name) == updated
    cleared = sub.update_subscription(subscription=Subscription(name=name, topic=topic), update_mask=["retry_policy"])
    assert cleared.retry_policy is None and cleared.enable_message_ordering


@pytest.mark.parametrize("path", ["filter", "enable_message_ordering"])
def test_filter_and_ordering_are_fixed_at_creation(sub, subscription, warehouse, path):
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:
        sub.update_subscription(subscription={"name": subscription, path: "x"}, update_mask=[path])
    assert e.value.field == "update_mask" and "cannot update" in e.value.rule
    assert table_versions(warehouse) == before


def test_bad_policies_write_nothing(sub, topic, subscription, warehouse):
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument, match=r"retry_policy.maximum_backoff: must be 0..600 seconds, got 601"):
        sub.create_subscription(request={"name": sub.subscription_path("local", "bad-retry"), "topic": topic,
                                         "retry_policy": {"maximum_backoff": 601}})
    with pytest.raises(InvalidArgument, match=r"dead_letter_policy.max_delivery_attempts: must be 5..100, got 3"):
        sub.update_subscription(subscription={"name": subscription, "dead_letter_policy": {
            "dead_letter_topic": topic, "max_delivery_attempts": 3}}, update_mask=["dead_letter_policy"])
    with pytest.raises(InvalidArgument, match="filter: must be at most 256 bytes"):
        sub.create_subscription(request={"name": sub.subscription_path("local", "bad-filter"), "topic": topic, "filter": "a" * 300})
    assert table_versions(warehouse) == before
