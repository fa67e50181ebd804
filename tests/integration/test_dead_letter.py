"""Dead-letter topics on real Delta tables (issue 13): pull with nacks and an injected clock,
subscribe(), create/update checks, the backlog, and crashes (delivery/dead_letter.py).

A message delivered max_delivery_attempts times without an ack is published to the
dead-letter topic (with the four CloudPubSubDeadLetterSource* attributes, data and
attributes kept) and acked on the source subscription.
"""

from __future__ import annotations

import time

import pytest

from deltabus import SubscriberClient
from deltabus.errors import InvalidArgument, NotFound
from deltabus.push.body import rfc3339
from deltabus.types import DeadLetterPolicy
from tests.conftest import ManualClock, table_versions

ATTRS = (
    "CloudPubSubDeadLetterSourceDeliveryCount",
    "CloudPubSubDeadLetterSourceSubscription",
    "CloudPubSubDeadLetterSourceSubscriptionProject",
    "CloudPubSubDeadLetterSourceTopicPublishTime",
)


@pytest.fixture
def dlq(pub, csub):
    """The dead-letter topic and a pull subscription on it."""
    t = pub.topic_path("local", "dead-letters")
    pub.create_topic(name=t)
    s = csub.subscription_path("local", "dead-letters-pull")
    csub.create_subscription(name=s, topic=t)
    return t, s


def make(csub: SubscriberClient, topic: str, name: str, dead_letter_topic: str, attempts: int = 5) -> str:
    path = csub.subscription_path("local", name)
    csub.create_subscription(request={"name": path, "topic": topic,
                                      "dead_letter_policy": DeadLetterPolicy(dead_letter_topic, attempts)})
    return path


def pull(client, subscription, n=10):
    return client.pull(subscription=subscription, max_messages=n, return_immediately=True).received_messages


def nack(client, subscription, received):
    client.modify_ack_deadline(subscription=subscription, ack_ids=[r.ack_id for r in received], ack_deadline_seconds=0)


def test_after_exactly_max_attempts_the_message_moves_to_the_dead_letter_topic(pub, csub, topic, dlq):
    dl_topic, dl_sub = dlq
    s = make(csub, topic, "dl-pull", dl_topic, 5)
    (mid,) = pub.publish_batch(topic, [{"data": b"poison", "attributes": {"k": "v"}, "ordering_key": ""}])
    seen = []
    for _ in range(5):
        (got,) = pull(csub, s)
        seen.append(got.delivery_attempt)
        source_time = got.message.publish_time
        nack(csub, s, [got])
    assert seen == [1, 2, 3, 4, 5]
    assert pull(csub, s) == []  # the 6th would-be delivery is the dead-lettering instead
    stats = {b.subscription: b for b in csub.refresh_backlog()}
    assert (stats[s].num_unacked_messages, stats[s].dead_lettered, stats[s].dead_letter_blocked) == (0, 1, 0)
    assert stats[dl_sub].dead_lettered is None  # no policy: null
    (copy,) = pull(csub, dl_sub)
    m = copy.message
    assert m.data == b"poison" and m.message_id != mid
    assert {k: v for k, v in m.attributes.items() if k not in ATTRS} == {"k": "v"}
    assert m.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert m.attributes["CloudPubSubDeadLetterSourceSubscription"] == "dl-pull"
    assert m.attributes["CloudPubSubDeadLetterSourceSubscriptionProject"] == "local"
    published = m.attributes["CloudPubSubDeadLetterSourceTopicPublishTime"]
    assert published == rfc3339(source_time) and published.endswith("Z")
    # Nothing left marked, and a later pull of the source moves nothing more.
    assert pull(csub, s) == [] and pull(csub, dl_sub) == []


def test_a_dead_letter_topic_that_does_not_exist_is_refused_at_create_and_update_writing_nothing(pub, csub, topic, dlq, warehouse):
    missing = pub.topic_path("local", "no-such-topic")
    s = csub.subscription_path("local", "dl-missing")
    before = table_versions(warehouse)
    with pytest.raises(NotFound, match=r"dead_letter_policy\.dead_letter_topic.*no-such-topic"):
        csub.create_subscription(request={"name": s, "topic": topic, "dead_letter_policy": DeadLetterPolicy(missing, 5)})
    with pytest.raises(InvalidArgument, match=r"max_delivery_attempts: must be 5\.\.100"):
        csub.create_subscription(request={"name": s, "topic": topic, "dead_letter_policy": {"dead_letter_topic": dlq[0],
                                                                                            "max_delivery_attempts": 4}})
    assert table_versions(warehouse) == before
    csub.create_subscription(name=s, topic=topic)
    before = table_versions(warehouse)
    with pytest.raises(NotFound, match="no-such-topic"):
        csub.update_subscription(subscription={"name": s, "dead_letter_policy": DeadLetterPolicy(missing, 5)},
                                 update_mask=["dead_letter_policy"])
    assert table_versions(warehouse) == before
    got = csub.update_subscription(subscription={"name": s, "dead_letter_policy": DeadLetterPolicy(dlq[0], 7)},
                                   update_mask=["dead_letter_policy"])
    assert got.dead_letter_policy == DeadLetterPolicy(dlq[0], 7)


def test_a_deleted_dead_letter_topic_keeps_the_message_on_the_subscription(pub, csub, topic, dlq):
    dl_topic, _ = dlq
    s = make(csub, topic, "dl-gone", dl_topic, 5)
    pub.publish_batch(topic, [{"data": b"stays"}])
    for _ in range(5):
        (got,) = pull(csub, s)
        nack(csub, s, [got])
    pub.delete_topic(topic=dl_topic)
    # No topic to publish to: the message stays, unacked, and is delivered again (as Pub/Sub).
    (again,) = pull(csub, s)
    assert again.delivery_attempt == 6 and again.message.data == b"stays"
    stats = csub.get_backlog(s)
    assert (stats.num_unacked_messages, stats.dead_lettered, stats.dead_letter_blocked) == (1, None, 1)


@pytest.mark.parametrize("then", ["keep the policy", "clear the policy"])
def test_a_move_cut_after_its_mark_whose_topic_is_then_deleted_gives_the_message_back(pub, csub, topic, dlq, monkeypatch, then):
    from deltabus.delivery import dead_letter

    dl_topic, _ = dlq
    s = make(csub, topic, "dl-cut", dl_topic, 5)
    pub.publish_batch(topic, [{"data": b"held"}])
    for _ in range(5):
        (got,) = pull(csub, s)
        nack(csub, s, [got])
    with monkeypatch.context() as m:
        m.setattr(dead_letter.DeadLetterMover, "finish", lambda self, engine, key: None)  # the process dies after the mark
        assert pull(csub, s) == []  # given up: marked, so held
    pub.delete_topic(topic=dl_topic)
    if then == "clear the policy":
        csub.update_subscription(request={"subscription": {"name": s}, "update_mask": {"paths": ["dead_letter_policy"]}})
    # Nothing left to finish the move with: the mark is released and the message comes back.
    (again,) = pull(csub, s)
    assert again.message.data == b"held" and again.delivery_attempt == 6
    csub.acknowledge(subscription=s, ack_ids=[again.ack_id])
    assert csub.get_backlog(s).num_unacked_messages == 0


def test_subscribe_nacking_every_delivery_sees_exactly_max_attempts(pub, sub, topic):
    t = pub.topic_path("local", "dl-stream-dlq")
    pub.create_topic(name=t)
    dl_sub = sub.subscription_path("local", "dl-stream-dlq-pull")
    sub.create_subscription(name=dl_sub, topic=t)
    s = make(sub, topic, "dl-stream", t, 5)
    pub.publish_batch(topic, [{"data": b"nacked"}])
    attempts: list[int] = []

    def callback(message):
        attempts.append(message.delivery_attempt)
        message.nack()

    future = sub.subscribe(s, callback)
    copies = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not copies:
            copies = pull(sub, dl_sub)
            time.sleep(0.1)
    finally:
        future.cancel()
        future.result(timeout=10)
    assert attempts == [1, 2, 3, 4, 5]
    (copy,) = copies
    assert copy.message.data == b"nacked" and copy.message.attributes["CloudPubSubDeadLetterSourceSubscription"] == "dl-stream"


def test_the_cli_sets_the_policy_refuses_a_missing_topic_and_pulls_the_copy(capsys, pub, warehouse):
    import json as _json

    from deltabus import cli

    def deltabus(*argv: str, code: int = 0) -> str:
        got = cli.main(["--warehouse", warehouse, "--project", "cli", *argv])
        cap = capsys.readouterr()
        assert got == code, cap.err
        return cap.out if code == 0 else cap.err

    deltabus("topics", "create", "orders")
    err = deltabus("subscriptions", "create", "orders-dl", "--topic", "orders", "--dead-letter-topic", "dlq", code=1)
    assert "dead_letter_policy.dead_letter_topic" in err and "projects/cli/topics/dlq" in err
    deltabus("topics", "create", "dlq")
    deltabus("subscriptions", "create", "dlq-pull", "--topic", "dlq")
    deltabus("subscriptions", "create", "orders-dl", "--topic", "orders", "--dead-letter-topic", "dlq", "--max-delivery-attempts", "5")
    pub.publish_batch("projects/cli/topics/orders", [{"data": b"cli"}])
    with SubscriberClient(warehouse=warehouse) as client:
        for _ in range(5):
            (got,) = pull(client, "projects/cli/subscriptions/orders-dl")
            nack(client, "projects/cli/subscriptions/orders-dl", [got])
    assert deltabus("pull", "orders-dl") == ""  # the would-be 6th delivery moved it instead
    (line,) = deltabus("pull", "dlq-pull", "--ack").splitlines()
    copy = _json.loads(line)
    assert copy["data"] == "cli" and copy["attributes"]["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert copy["attributes"]["CloudPubSubDeadLetterSourceSubscriptionProject"] == "cli"


@pytest.mark.spark
@pytest.mark.cluster  # delta-spark MERGEs take seconds each on this machine
def test_on_delta_spark_the_mark_holds_the_row_against_an_ack_and_recovery_moves_it(spark, pub, csub, topic, dlq, warehouse, monkeypatch):
    """The engine-specific part: Spark's MERGE runs the GIVE_UP clause (a mark, with the
    intent's app transaction), its ACK clause leaves a marked row alone, and the keyed copy
    and the drop run on delta-spark. The first five deliveries are made on delta-rs."""
    from deltabus.delivery.dead_letter import DeadLetterMover
    from deltabus.storage import open_engine
    from tests.conftest import requires_delta

    requires_delta(spark)
    dl_topic, dl_sub = dlq
    s = make(csub, topic, "spark-dl", dl_topic, 5)
    pub.publish_batch(topic, [{"data": b"spark"}])
    for _ in range(5):
        (last,) = pull(csub, s)
        nack(csub, s, [last])
    engine = open_engine(warehouse, engine="delta-spark", spark=spark, create=False)
    client = SubscriberClient(engine=engine)
    try:
        monkeypatch.setattr(DeadLetterMover, "finish", lambda self, engine, key: None)  # "crash" after the mark
        assert pull(client, s) == []
        client.acknowledge(subscription=s, ack_ids=[last.ack_id])  # the 5th delivery's ack id: refused, the row is marked
        rows = engine.snapshot("deliveries").read(columns=["message_id", "dead_letter_key"], partition=client._sub(s).sub_uid)
        assert rows.num_rows == 1 and rows["dead_letter_key"][0].as_py() is not None
        monkeypatch.undo()
        assert pull(client, s) == []  # recovers first: copy and drop on delta-spark
        assert engine.snapshot("deliveries").read(columns=["message_id"], partition=client._sub(s).sub_uid).num_rows == 0
    finally:
        client.close()
    (copy,) = pull(csub, dl_sub)
    assert copy.message.data == b"spark" and copy.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
