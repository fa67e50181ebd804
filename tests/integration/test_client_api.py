"""The clients' surface, as google-cloud-pubsub's: request= everywhere it has it, the same
keyword names, pagers for list_*, and nothing works after close()."""

from __future__ import annotations

import inspect

import pytest

from deltabus import ClientClosed, InvalidArgument, PublisherClient, SubscriberClient
from deltabus.pagers import ListSubscriptionsPager, ListTopicsPager, ListTopicSubscriptionsPager
from tests.conftest import table_versions


# The flattened keyword fields of google-cloud-pubsub 2.x's methods (GAPIC signatures, and the
# hand-written publish/subscribe). Ours must take at least these names.
PUBSUB_KEYWORDS = {
    PublisherClient: {
        "create_topic": {"name"},
        "get_topic": {"topic"},
        "list_topics": {"project"},
        "list_topic_subscriptions": {"topic"},
        "delete_topic": {"topic"},
        "publish": {"topic", "data", "ordering_key"},
    },
    SubscriberClient: {
        "create_subscription": {"name", "topic", "push_config", "ack_deadline_seconds"},
        "get_subscription": {"subscription"},
        "update_subscription": {"subscription", "update_mask"},
        "list_subscriptions": {"project"},
        "delete_subscription": {"subscription"},
        "modify_ack_deadline": {"subscription", "ack_ids", "ack_deadline_seconds"},
        "acknowledge": {"subscription", "ack_ids"},
        "pull": {"subscription", "return_immediately", "max_messages"},
        "modify_push_config": {"subscription", "push_config"},
        "subscribe": {"subscription", "callback", "flow_control", "scheduler", "use_legacy_flow_control", "await_callbacks_on_shutdown"},
    },
}
# Methods without request=, as in google-cloud-pubsub (publish, resume_publish and subscribe are its hand-written ones).
NO_REQUEST = {PublisherClient: {"publish", "resume_publish", "stop", "close"}, SubscriberClient: {"subscribe", "close"}}


def public_methods(cls) -> set[str]:
    return {
        n for n, v in vars(cls).items()
        if not n.startswith("_") and inspect.isfunction(v)  # staticmethod path helpers and properties are not RPCs
    } | {n for base in cls.__mro__[1:-1] for n, v in vars(base).items() if not n.startswith("_") and inspect.isfunction(v)}


@pytest.mark.parametrize("cls", [PublisherClient, SubscriberClient])
def test_every_method_takes_request_and_pubsubs_keyword_names(cls):
    methods = public_methods(cls)
    assert set(PUBSUB_KEYWORDS[cls]) <= methods
    for name in sorted(methods - NO_REQUEST[cls]):
        params = inspect.signature(getattr(cls, name)).parameters
        assert "request" in params and params["request"].default is None, f"{cls.__name__}.{name} lacks request="
    for name, expected in PUBSUB_KEYWORDS[cls].items():
        params = set(inspect.signature(getattr(cls, name)).parameters)
        assert expected <= params, f"{cls.__name__}.{name} lacks {expected - params}"


def test_request_dicts_give_the_same_answers_as_keywords(pub, sub, warehouse):
    topic = pub.topic_path("local", "orders")
    s = sub.subscription_path("local", "orders-pull")
    called: set[str] = set()

    def call(client, method, **request):
        called.add(method)
        return getattr(client, method)(request=request)

    assert call(pub, "create_topic", name=topic, labels={"team": "data"}).labels == {"team": "data"}
    assert call(pub, "get_topic", topic=topic) == pub.get_topic(topic=topic)
    call(sub, "create_subscription", name=s, topic=topic, ack_deadline_seconds=20)
    assert call(sub, "get_subscription", subscription=s) == sub.get_subscription(subscription=s)
    assert [t.name for t in call(pub, "list_topics", project="local", page_size=1)] == [topic]
    assert list(call(pub, "list_topic_subscriptions", topic=topic)) == [s]
    assert [x.name for x in call(sub, "list_subscriptions", project="projects/local")] == [s]
    [mid] = call(pub, "publish_batch", topic=topic, messages=[{"data": b"a"}])
    got = call(sub, "pull", subscription=s, max_messages=1, return_immediately=True).received_messages
    assert [r.message.message_id for r in got] == [mid]
    call(sub, "modify_ack_deadline", subscription=s, ack_ids=[got[0].ack_id], ack_deadline_seconds=60)
    assert call(sub, "get_backlog", subscription=s).num_outstanding_messages == 1
    assert sub.get_backlog(s).subscription == sub.get_backlog(subscription=s).subscription == s
    call(sub, "acknowledge", subscription=s, ack_ids=[got[0].ack_id])
    assert [b.subscription for b in call(sub, "refresh_backlog")] == [s]
    call(sub, "update_subscription", subscription={"name": s, "labels": {"a": "b"}}, update_mask=["labels"])
    call(sub, "modify_push_config", subscription=s, push_config={})
    assert sub.get_subscription(subscription=s).labels == {"a": "b"}
    assert call(pub, "update_topic", topic={"name": topic, "message_retention_duration": 3600},
                update_mask=["message_retention_duration"]).message_retention_duration == 3600
    snap = sub.snapshot_path("local", "orders-snap")
    assert call(sub, "create_snapshot", name=snap, subscription=s, labels={"k": "v"}) == sub.get_snapshot(snapshot=snap)
    assert call(sub, "get_snapshot", snapshot=snap).labels == {"k": "v"}
    assert [x.name for x in call(sub, "list_snapshots", project="local")] == [snap]
    assert call(sub, "update_snapshot", snapshot={"name": snap, "labels": {}}, update_mask=["labels"]).labels == {}
    assert call(sub, "seek", subscription=s, snapshot=snap) == call(sub, "seek", subscription=s, time=0)
    call(sub, "delete_snapshot", snapshot=snap)
    call(pub, "detach_subscription", subscription=s)
    assert sub.get_subscription(subscription=s).detached
    call(sub, "delete_subscription", subscription=s)
    call(pub, "delete_topic", topic=topic)
    # publish_dataframe's request= needs Spark: test_publish_dataframe_takes_a_request below.
    expected = (public_methods(PublisherClient) - NO_REQUEST[PublisherClient] - {"publish_dataframe"}) | (
        public_methods(SubscriberClient) - NO_REQUEST[SubscriberClient]
    )
    assert called == expected

    with pytest.raises(InvalidArgument, match="unknown fields") as e:
        sub.get_backlog(request={"subscription": s, "nope": 1})
    assert e.value.field == "request"
    with pytest.raises(InvalidArgument, match="either request or keyword"):
        sub.get_backlog(s, request={"subscription": s})
    with pytest.raises(InvalidArgument, match="unknown fields"):
        sub.refresh_backlog(request={"subscription": s})


@pytest.mark.spark
def test_publish_dataframe_takes_a_request(spark, pub, topic, sub, subscription):
    df = spark.createDataFrame([(b"x",), (b"y",)], "data binary")
    assert pub.publish_dataframe(request={"topic": topic, "dataframe": df}) == 2
    assert len(sub.pull(subscription=subscription, max_messages=5, return_immediately=True).received_messages) == 2


def _call_refused(client, name, topic, subscription):
    if name == "publish":
        return client.publish(topic, b"x")
    if name == "subscribe":
        return client.subscribe(subscription, print)
    if name == "resume_publish":
        return client.resume_publish(topic, "key")
    return getattr(client, name)(request={})


@pytest.mark.parametrize("cls", [PublisherClient, SubscriberClient])
def test_every_method_is_refused_after_close(cls, warehouse, topic, subscription):
    client = cls(warehouse=warehouse)
    if cls is SubscriberClient:
        assert client.pull(subscription=subscription, max_messages=1, return_immediately=True).received_messages == []
    client.close()
    before = table_versions(warehouse)
    for name in sorted(public_methods(cls) - {"close", "stop"}):
        with pytest.raises(ClientClosed, match=rf"{cls.__name__}\.{name}\(\): the client is closed") as e:
            _call_refused(client, name, topic, subscription)
        assert isinstance(e.value, RuntimeError)
    with pytest.raises(ClientClosed):
        with client:
            pass
    client.close()  # idempotent
    assert table_versions(warehouse) == before
    # Path helpers are plain string formatting and keep working, as in google-cloud-pubsub.
    assert client.topic_path("local", "orders2") == "projects/local/topics/orders2"


def test_close_stops_streams_and_later_pages(pub, warehouse, topic, subscription):
    pub.publish_batch(topic, [{"data": b"held"}])
    client = SubscriberClient(warehouse=warehouse)
    held = []
    future = client.subscribe(subscription, held.append)
    for _ in range(600):
        if held:
            break
        import time

        time.sleep(0.05)
    for i in range(3):
        client.create_subscription(name=client.subscription_path("local", f"more-{i}"), topic=topic)
    pager = client.list_subscriptions(project="local", page_size=2)
    with client:
        pass  # leaving the block closes the client
    assert future.result(timeout=30) is True  # the stream was stopped
    with pytest.raises(ClientClosed):
        list(pager)  # the first page is at hand, the second would be a call
    # What the stream held was given back at close: due again at once.
    other = SubscriberClient(warehouse=warehouse)
    again = other.pull(subscription=subscription, max_messages=5, return_immediately=True).received_messages
    assert [(r.message.data, r.delivery_attempt) for r in again] == [(b"held", 2)]


def test_publisher_stop_refuses_publishing_but_keeps_topic_calls(warehouse, topic):
    client = PublisherClient(warehouse=warehouse)
    client.stop()
    for publish in (lambda: client.publish(topic, b"x"), lambda: client.publish_batch(topic, [{"data": b"x"}])):
        with pytest.raises(ClientClosed, match="stopped publisher"):
            publish()
    assert client.get_topic(topic=topic).name == topic  # google-cloud-pubsub's stop() ends publishing only
    client.close()
    with pytest.raises(ClientClosed):
        client.get_topic(topic=topic)


# -- pagers ---------------------------------------------------------------------------
def test_list_topics_pages(pub, warehouse):
    names = [pub.topic_path("local", f"topic{i}") for i in range(5)]
    for n in reversed(names):
        pub.create_topic(name=n)
    pub.create_topic(name=pub.topic_path("elsewhere", "topic9"))

    pager = pub.list_topics(project="local", page_size=2)
    assert isinstance(pager, ListTopicsPager)
    assert [t.name for t in pager.topics] == names[:2] and pager.next_page_token  # the first page's fields
    pages = list(pager.pages)
    assert [[t.name for t in p.topics] for p in pages] == [names[:2], names[2:4], names[4:]]
    assert [bool(p.next_page_token) for p in pages] == [True, True, False]
    assert pager.next_page_token == ""  # the last page fetched
    assert [t.name for t in pager] == names  # iterating starts again and runs across pages
    assert [t.name for t in pub.list_topics(project="local")] == names  # default page size holds them all

    # Resume from a token; the listing stays stable while topics come and go in between.
    token = pages[0].next_page_token
    pub.create_topic(name=pub.topic_path("local", "topic0a"))  # sorts into the page already read
    pub.delete_topic(topic=names[2])
    resumed = pub.list_topics(request={"project": "local", "page_size": 2, "page_token": token})
    assert [t.name for t in resumed] == names[3:]


def test_bad_page_arguments_are_invalid_and_name_the_field(pub, sub, topic, subscription):
    token = pub.list_topics(project="local", page_size=1).next_page_token or "x"
    cases = [
        (lambda: pub.list_topics(project="local", page_token="not-a-token"), "page_token"),
        (lambda: pub.list_topics(project="other", page_token=token), "page_token"),
        (lambda: sub.list_subscriptions(project="local", page_token=token), "page_token"),
        (lambda: pub.list_topic_subscriptions(topic=topic, page_token=token), "page_token"),
        (lambda: pub.list_topics(project="local", page_size=-1), "page_size"),
        (lambda: sub.list_subscriptions(project="local", page_size="10"), "page_size"),
    ]
    for call, field in cases:
        with pytest.raises(InvalidArgument) as e:
            call()
        assert e.value.field == field


def test_list_subscriptions_and_topic_subscriptions_page(pub, sub, topic):
    other = pub.topic_path("local", "other")
    pub.create_topic(name=other)
    mine = [sub.subscription_path("local", f"sub{i}") for i in range(3)]
    for n in mine:
        sub.create_subscription(name=n, topic=topic)
    sub.create_subscription(name=sub.subscription_path("local", "z-other"), topic=other)

    pager = sub.list_subscriptions(project="local", page_size=3)
    assert isinstance(pager, ListSubscriptionsPager)
    assert [len(p.subscriptions) for p in pager.pages] == [3, 1]
    assert [s.name for s in pager] == mine + [sub.subscription_path("local", "z-other")]

    tp = pub.list_topic_subscriptions(topic=topic, page_size=2)
    assert isinstance(tp, ListTopicSubscriptionsPager)
    assert [p.subscriptions for p in tp.pages] == [mine[:2], mine[2:]]
    assert list(tp) == mine
