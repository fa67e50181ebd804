"""The delivery-policy fields of a subscription (issue 13) through the client: create, get,
update (Pub/Sub's mutability), clearing a policy, and bad requests writing nothing."""

from __future__ import annotations

import json

import pytest

from deltabus import InvalidArgument, SubscriberClient, cli
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


# -- the CLI, in process (the same main() the console script calls) -----------------------------
def run(capsys, warehouse: str, *argv: str, code: int = 0) -> str:
    got = cli.main(["--warehouse", warehouse, *argv], environ={"DELTABUS_PROJECT": "cli", "DELTABUS_ENGINE": "delta-rs"})
    cap = capsys.readouterr()
    assert got == code, cap.err
    return cap.out if code == 0 else cap.err


def test_cli_creates_gets_updates_and_clears_policies(capsys, warehouse):
    run(capsys, warehouse, "topics", "create", "events")
    run(capsys, warehouse, "topics", "create", "dead")
    run(capsys, warehouse, "subscriptions", "create", "s-1", "--topic", "events", "--min-backoff", "1.5",
        "--dead-letter-topic", "dead", "--filter", "attributes:kind", "--enable-message-ordering")
    got = json.loads(run(capsys, warehouse, "subscriptions", "get", "s-1"))
    assert got["retry_policy"] == {"minimum_backoff": 1.5, "maximum_backoff": 600.0}
    assert got["dead_letter_policy"] == {"dead_letter_topic": "projects/cli/topics/dead", "max_delivery_attempts": 5}
    assert (got["filter"], got["enable_message_ordering"]) == ("attributes:kind", True)
    run(capsys, warehouse, "subscriptions", "update", "s-1", "--max-backoff", "20", "--clear-dead-letter-policy")
    got = json.loads(run(capsys, warehouse, "subscriptions", "get", "s-1"))
    assert (got["retry_policy"], got["dead_letter_policy"]) == ({"minimum_backoff": 10.0, "maximum_backoff": 20.0}, None)
    run(capsys, warehouse, "subscriptions", "update", "s-1", "--clear-retry-policy")
    got = json.loads(run(capsys, warehouse, "subscriptions", "get", "s-1"))
    assert got["retry_policy"] is None and got["filter"] == "attributes:kind"
    before = table_versions(warehouse)
    err = run(capsys, warehouse, "subscriptions", "update", "s-1", "--min-backoff", "700", code=1)
    assert err == "deltabus: error: --min-backoff: must be 0..600 seconds, got 700\n"
    err = run(capsys, warehouse, "subscriptions", "create", "s-2", "--topic", "events", "--dead-letter-topic", "dead",
              "--max-delivery-attempts", "4", code=1)
    assert err == "deltabus: error: --max-delivery-attempts: must be 5..100, got 4\n"
    assert table_versions(warehouse) == before
