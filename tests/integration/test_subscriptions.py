import pytest

from deltabus import AlreadyExists, InvalidArgument, NotFound, SubscriberClient
from deltabus.types import NoWrapper, OidcToken, PushConfig, Subscription
from tests.conftest import table_versions

PUSH = {
    "push_endpoint": "https://example.com/push",
    "oidc_token": {"service_account_email": "pusher@local.iam.gserviceaccount.com", "audience": "my-aud"},
    "no_wrapper": {"write_metadata": True},
}


def test_create_get_list(sub: SubscriberClient, topic):
    a = sub.subscription_path("local", "a-pull")
    b = sub.subscription_path("local", "b-push")
    created = sub.create_subscription(name=a, topic=topic, labels={"env": "dev"})
    assert created == Subscription(name=a, topic=topic, ack_deadline_seconds=10, labels={"env": "dev"})
    sub.create_subscription(request={"name": b, "topic": topic, "push_config": PUSH, "ack_deadline_seconds": 60})
    got = sub.get_subscription(subscription=b)
    assert got.push_config == PushConfig(
        push_endpoint="https://example.com/push",
        oidc_token=OidcToken("pusher@local.iam.gserviceaccount.com", "my-aud"),
        no_wrapper=NoWrapper(True),
    )
    assert got.ack_deadline_seconds == 60
    assert [s.name for s in sub.list_subscriptions(project="local")] == [a, b]
    assert list(sub.list_subscriptions(project="other")) == []


def test_update_subscription_and_modify_push_config(sub, topic, subscription):
    updated = sub.update_subscription(
        subscription={"name": subscription, "ack_deadline_seconds": 120, "labels": {"tier": "gold"}},
        update_mask=["ack_deadline_seconds", "labels"],
    )
    assert (updated.ack_deadline_seconds, updated.labels) == (120, {"tier": "gold"})
    sub.modify_push_config(subscription=subscription, push_config=PUSH)
    assert sub.get_subscription(subscription=subscription).push_config.push_endpoint == "https://example.com/push"
    sub.modify_push_config(subscription=subscription, push_config={})  # back to pull
    got = sub.get_subscription(subscription=subscription)
    assert not got.push_config.is_push and got.ack_deadline_seconds == 120


def test_update_keeps_messages(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": b"kept"}])
    sub.update_subscription(subscription=Subscription(name=subscription, topic=topic, ack_deadline_seconds=30), update_mask=["ack_deadline_seconds"])
    got = sub.pull(subscription=subscription, max_messages=5, return_immediately=True).received_messages
    assert [r.message.data for r in got] == [b"kept"]


def test_create_twice_and_missing_topic(sub, topic, subscription, warehouse):
    before = table_versions(warehouse)
    with pytest.raises(AlreadyExists):
        sub.create_subscription(name=subscription, topic=topic)
    with pytest.raises(NotFound) as e:
        sub.create_subscription(name=sub.subscription_path("local", "x-sub"), topic="projects/local/topics/missing")
    assert e.value.kind == "topic"
    with pytest.raises(NotFound):
        sub.get_subscription(subscription="projects/local/subscriptions/missing")
    with pytest.raises(NotFound):
        sub.delete_subscription(subscription="projects/local/subscriptions/missing")
    assert table_versions(warehouse) == before


def test_http_endpoint_needs_allow_http(warehouse, topic):
    strict = SubscriberClient(warehouse=warehouse, allow_http=False)
    with pytest.raises(InvalidArgument) as e:
        strict.create_subscription(name="projects/local/subscriptions/plain", topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    assert e.value.field == "push_config.push_endpoint" and "https" in e.value.rule
    relaxed = SubscriberClient(warehouse=warehouse, allow_http=True)
    relaxed.create_subscription(name="projects/local/subscriptions/plain", topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})


def test_allow_http_from_environment(warehouse, topic, monkeypatch):
    monkeypatch.setenv("DELTABUS_ALLOW_HTTP", "1")
    SubscriberClient(warehouse=warehouse).create_subscription(
        name="projects/local/subscriptions/plain", topic=topic, push_config={"push_endpoint": "http://localhost:8080/"}
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "TOPIC"}, "topic"),
        ({"name": "bad", "topic": "projects/local/topics/orders"}, "name"),
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "projects/local/topics/orders", "ack_deadline_seconds": 5}, "ack_deadline_seconds"),
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "projects/local/topics/orders", "ack_deadline_seconds": 601}, "ack_deadline_seconds"),
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "projects/local/topics/orders", "push_config": {"push_endpoint": "gopher://x"}}, "push_config.push_endpoint"),
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "projects/local/topics/orders", "push_config": {"push_endpoint": "https://x", "oidc_token": {"service_account_email": "x"}}}, "push_config.oidc_token.service_account_email"),
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "projects/local/topics/orders", "labels": {"k": "UPPER"}}, "labels['k']"),
        ({"name": "projects/local/subscriptions/ok-sub", "topic": "projects/local/topics/orders", "enable_message_ordering": "yes"}, "enable_message_ordering"),
    ],
)
def test_bad_subscription_requests_write_nothing(sub, topic, warehouse, kwargs, field):
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:
        sub.create_subscription(**kwargs)
    assert e.value.field == field
    assert table_versions(warehouse) == before


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"update_mask": ["topic"]}, "update_mask"),
        ({"update_mask": []}, "update_mask"),
        ({"update_mask": "labels"}, "update_mask"),
        ({"update_mask": ["ack_deadline_seconds"], "values": {"ack_deadline_seconds": 1000}}, "subscription.ack_deadline_seconds"),
        ({"update_mask": ["push_config"], "values": {"push_config": {"push_endpoint": "nope"}}}, "push_config.push_endpoint"),
    ],
)
def test_bad_updates_write_nothing(sub, subscription, warehouse, kwargs, field):
    before = table_versions(warehouse)
    body = {"name": subscription, **kwargs.get("values", {})}
    with pytest.raises(InvalidArgument) as e:
        sub.update_subscription(subscription=body, update_mask=kwargs["update_mask"])
    assert e.value.field == field
    assert table_versions(warehouse) == before
