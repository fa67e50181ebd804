"""A push subscription catching up from the change feed fans out whole versions, at most
its limit per batch, on a real delta-rs warehouse (delivery/fanout.py ``catch_up``)."""

from __future__ import annotations

import time

import pyarrow as pa

from deltabus.delivery import fanout
from deltabus.registry import Registry
from deltabus.storage.tables import DELIVERIES, MESSAGES


def _empty_batch() -> pa.Table:
    # The stream's micro-batch of versions first..last; a lagging subscription reads the change feed instead.
    return pa.table({"topic_uid": pa.array([], pa.string()), "message_id": pa.array([], pa.string()),
                     "publish_time": pa.array([], pa.timestamp("us", tz="UTC")), "ordering_key": pa.array([], pa.string()),
                     "size_bytes": pa.array([], pa.int64()), "version": pa.array([], pa.int64())})


def test_a_lagging_subscription_catches_up_in_whole_versions_within_its_limit(pub, sub, topic):
    name = sub.subscription_path("local", "catching-up")
    sub.create_subscription(name=name, topic=topic)
    other = pub.topic_path("local", "other-topic")
    pub.create_topic(name=other)
    sizes = [30, 5, 0, 12, 40, 1, 7, 25]  # messages per version of this topic; 0: a version of another topic
    published: list[str] = []
    for n in sizes:
        if n:
            published += pub.publish_batch(topic, [{"data": b"x"}] * n)
        else:
            pub.publish_batch(other, [{"data": b"y"}] * 3)
    engine = sub.engine
    rec = Registry(engine, clock=time.time).subscription(name)
    last = engine.version(MESSAGES.name)
    first = last  # the stream's batch starts at the end: the subscription lags from its start version
    seen: list[str] = []
    batches = 0
    limit = 20
    while True:
        snap = engine.snapshot(DELIVERIES.name)
        fan = fanout.from_batch(engine, snap, rec, _empty_batch(), first, last, limit=limit)
        if fan.end == fan.cursor:
            break
        versions = fan.rows["message_version"].to_pylist()
        assert max(versions) <= fan.end
        # whole versions, within the limit unless one version alone holds more
        assert fan.rows.num_rows <= limit or len(set(versions)) == 1, (fan.rows.num_rows, set(versions))
        seen += fan.rows["message_id"].to_pylist()
        engine.transact(DELIVERIES.name, lambda s, fan=fan: s.commit_txns(fan.txns(rec.sub_uid)), what="test cursor")
        batches += 1
        assert batches < 20
    assert fan.end == last
    assert seen == published  # every message once, in publish order
    assert batches >= 5  # 120 messages at 20 a batch (40 alone in one)

    # A full window (limit 0) reads nothing and leaves the cursor.
    pub.publish_batch(topic, [{"data": b"z"}] * 3)
    later = engine.version(MESSAGES.name)
    fan = fanout.from_batch(engine, engine.snapshot(DELIVERIES.name), rec, _empty_batch(), later, later, limit=0)
    assert fan.rows.num_rows == 0 and fan.end == fan.cursor == last
    # No limit: the whole range at once, as before.
    fan = fanout.from_batch(engine, engine.snapshot(DELIVERIES.name), rec, _empty_batch(), later, later)
    assert fan.rows.num_rows == 3 and fan.end == later


def _deliveries_rows(engine, sub_uid: str) -> int:
    return engine.snapshot(DELIVERIES.name).read(columns=["message_id"], partition=sub_uid).num_rows


def _backlog(pub, topic, versions: int = 12, per: int = 1000) -> list[str]:
    ids: list[str] = []
    for _ in range(versions):
        ids += pub.publish_batch(topic, [{"data": b"x"}] * per)
    return ids


def test_a_pull_on_a_backlog_fans_out_about_what_it_leases(pub, sub, topic):
    """A pull of 100 on a backlog of 30,000 (30 versions) fans out whole versions up to
    PULL_CATCH_UP_MIN, not 500 versions; pulling and acking until empty gets each message once."""
    name = sub.subscription_path("local", "pull-catching-up")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
    published = _backlog(pub, topic, versions=30)
    uid = sub._sub(name).sub_uid
    first = sub.pull(subscription=name, max_messages=100, return_immediately=True).received_messages
    assert len(first) == 100
    assert _deliveries_rows(sub.engine, uid) == fanout.PULL_CATCH_UP_MIN  # 20 whole versions of 1,000, not all 30
    got = [m.message.message_id for m in first]
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in first])
    for _ in range(100):
        batch = sub.pull(subscription=name, max_messages=5000, return_immediately=True).received_messages
        if not batch:
            break
        got += [m.message.message_id for m in batch]
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in batch])
    assert sorted(got) == sorted(published) and len(got) == len(published)


def test_a_server_round_on_a_backlog_fans_out_about_what_it_leases(pub, sub, topic):
    """The group commit of `deltabus serve` (server/group_commit.run_round) likewise."""
    from deltabus.server.group_commit import Granted, LeaseAsk, run_round

    name = sub.subscription_path("local", "serve-catching-up")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
    published = _backlog(pub, topic, versions=30)
    rec = Registry(sub.engine, clock=time.time).subscription(name)
    [granted] = run_round(sub.engine, rec, [LeaseAsk(100, None)], time.time)
    assert isinstance(granted, Granted) and len(granted.messages) == 100 and granted.more
    assert _deliveries_rows(sub.engine, rec.sub_uid) == fanout.PULL_CATCH_UP_MIN
    seen = {m.message.message_id for m in granted.messages}
    for _ in range(30):
        [granted] = run_round(sub.engine, rec, [LeaseAsk(5000, None)], time.time)
        assert isinstance(granted, Granted)
        seen |= {m.message.message_id for m in granted.messages}
        if not granted.messages and not granted.more:
            break
    assert seen == set(published)  # every message leased (none acked: each leased once, for 600 s)


def test_catch_up_reads_on_past_versions_without_the_topic_and_stops_at_its_limit(pub, sub, topic):
    """More versions than the first read's PROBE_VERSIONS, the first ones all of another topic:
    the reads go on (twice the span each time) until the limit, in whole versions."""
    name = sub.subscription_path("local", "sparse-catching-up")
    sub.create_subscription(name=name, topic=topic)
    other = pub.topic_path("local", "busy-other")
    pub.create_topic(name=other)
    for _ in range(fanout.PROBE_VERSIONS + 5):
        pub.publish_batch(other, [{"data": b"o"}] * 10)
    mine: list[str] = []
    for n in (7, 7, 7, 7, 7, 7):
        mine += pub.publish_batch(topic, [{"data": b"m"}] * n)
    engine = sub.engine
    rec = Registry(engine, clock=time.time).subscription(name)
    last = engine.version(MESSAGES.name)
    fan = fanout.from_batch(engine, engine.snapshot(DELIVERIES.name), rec, _empty_batch(), last, last, limit=20)
    assert fan.rows["message_id"].to_pylist() == mine[:14]  # 2 whole versions of 7 (a third would make 21)
    assert fan.end == fan.cursor + fanout.PROBE_VERSIONS + 5 + 2  # past the other topic's versions


def test_a_filtered_pull_catches_up_past_versions_its_filter_drops(pub, sub, topic):
    """The limit counts the messages the filter keeps: 30 versions of 1,000 messages the
    filter drops (more than PULL_CATCH_UP_MIN) do not hold the cursor before the ones it keeps."""
    name = sub.subscription_path("local", "filtered-catching-up")
    sub.create_subscription(request={"name": name, "topic": topic, "filter": 'attributes.kind = "a"'})
    for _ in range(30):
        pub.publish_batch(topic, [{"data": b"b", "attributes": {"kind": "b"}}] * 1000)
    wanted = pub.publish_batch(topic, [{"data": b"a", "attributes": {"kind": "a"}}] * 5)
    got = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
    assert sorted(m.message.message_id for m in got) == sorted(wanted)


def test_strict_catch_up_leaves_a_version_larger_than_what_is_left(pub, sub, topic):
    """Within a shared budget (push/plan.py), a subscription that is not the first to take
    from it fans out nothing rather than a whole version over what is left."""
    name = sub.subscription_path("local", "strict-catching-up")
    sub.create_subscription(name=name, topic=topic)
    pub.publish_batch(topic, [{"data": b"x"}] * 50)
    engine = sub.engine
    rec = Registry(engine, clock=time.time).subscription(name)
    last = engine.version(MESSAGES.name)
    snap = engine.snapshot(DELIVERIES.name)
    fan = fanout.from_batch(engine, snap, rec, _empty_batch(), last, last, limit=20, strict=True)
    assert fan.rows.num_rows == 0 and fan.end == fan.cursor
    fan = fanout.from_batch(engine, snap, rec, _empty_batch(), last, last, limit=20)
    assert fan.rows.num_rows == 50 and fan.end == last  # the first to take from the budget: the whole version
