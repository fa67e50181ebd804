import pytest

from deltabus import AlreadyExists, InvalidArgument, NotFound, PublisherClient
from deltabus.types import Topic
from tests.conftest import table_versions


def test_create_get_list_delete(pub: PublisherClient):
    a = pub.topic_path("local", "alpha")
    b = pub.topic_path("local", "beta")
    other = pub.topic_path("elsewhere", "gamma")
    assert pub.create_topic(name=a, labels={"team": "data"}) == Topic(a, {"team": "data"})
    pub.create_topic(request={"name": b})
    pub.create_topic(name=other)
    assert pub.get_topic(topic=a).labels == {"team": "data"}
    assert [t.name for t in pub.list_topics(project="local")] == [a, b]
    assert [t.name for t in pub.list_topics(project="projects/elsewhere")] == [other]
    pub.delete_topic(topic=a)
    with pytest.raises(NotFound):
        pub.get_topic(topic=a)
    assert [t.name for t in pub.list_topics(project="local")] == [b]


def test_create_twice_is_already_exists_and_writes_nothing(pub, topic, warehouse):
    before = table_versions(warehouse)
    with pytest.raises(AlreadyExists) as e:
        pub.create_topic(name=topic)
    assert e.value.name == topic
    assert table_versions(warehouse) == before


def test_delete_unknown_is_not_found(pub):
    with pytest.raises(NotFound):
        pub.delete_topic(topic="projects/local/topics/nothing")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"name": "orders"}, "name"),
        ({"name": "projects/local/topics/go"}, "name"),
        ({"name": "projects/local/topics/googx"}, "name"),
        ({"name": "projects/local/topics/fine", "labels": {"BAD": "x"}}, "labels['BAD']"),
        ({}, "name"),
    ],
)
def test_bad_topic_requests_write_nothing(pub, warehouse, kwargs, field):
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:
        pub.create_topic(**kwargs)
    assert e.value.field == field
    assert table_versions(warehouse) == before


def test_request_and_keywords_are_exclusive(pub):
    with pytest.raises(InvalidArgument) as e:
        pub.create_topic(request={"name": "projects/local/topics/abc"}, name="projects/local/topics/abc")
    assert e.value.field == "request"


def test_recreated_topic_is_a_new_topic(pub, sub, topic):
    old = sub.subscription_path("local", "old-sub")
    sub.create_subscription(name=old, topic=topic)
    pub.publish_batch(topic, [{"data": b"before delete"}])
    pub.delete_topic(topic=topic)
    pub.create_topic(name=topic)
    pub.publish_batch(topic, [{"data": b"new topic"}])
    # The old subscription is attached to the deleted topic: it keeps what it held, nothing more.
    assert sub.get_subscription(subscription=old).topic == "_deleted-topic_"
    got = sub.pull(subscription=old, max_messages=10, return_immediately=True).received_messages
    assert [r.message.data for r in got] == [b"before delete"]
    assert list(pub.list_topic_subscriptions(topic=topic)) == []


def test_racing_creates_of_one_name_yield_one_topic(warehouse):
    import threading

    clients = [PublisherClient(warehouse=warehouse) for _ in range(4)]
    outcomes = []

    def create(c):
        try:
            c.create_topic(name="projects/local/topics/contested")
            outcomes.append("created")
        except AlreadyExists:
            outcomes.append("exists")

    threads = [threading.Thread(target=create, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created", "exists", "exists", "exists"]
    assert [t.name for t in clients[0].list_topics(project="local")] == ["projects/local/topics/contested"]
