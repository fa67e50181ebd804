"""Detaching a subscription in the library (``PublisherClient.detach_subscription``,
``delivery.detach``): the fan-out fence against a pull that read the registry before the
detach, a detach cut between its two commits, the push job leaving a detached subscription
alone, the Python clients' refusals, and a version-2 subscriptions table gaining the column.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus import PublisherClient, SubscriberClient
from deltabus.delivery import operations
from deltabus.delivery.cursor import DETACHED_CURSOR, cursor_app_id
from deltabus.errors import FailedPrecondition, InvalidArgument, NotFound, SubscriptionDetached
from deltabus.registry import Registry
from deltabus.storage import open_engine
from deltabus.storage.tables import SCHEMA_VERSION_KEY, SUBSCRIPTIONS
from deltabus.types import DetachSubscriptionResponse
from tests.conftest import table_versions
from tests.endpoints import Endpoint
from tests.integration.test_push import settings


def rows_of(warehouse: str, sub_uid: str) -> int:
    table = DeltaTable(f"{warehouse}/deliveries").to_pyarrow_table(columns=["sub_uid"])
    return int(pc.sum(pc.equal(table["sub_uid"], sub_uid)).as_py() or 0)


def test_the_python_clients_detach_and_refuse(pub: PublisherClient, sub: SubscriberClient, topic: str, subscription: str, warehouse: str) -> None:
    other = sub.subscription_path("local", "orders-other")
    sub.create_subscription(name=other, topic=topic)
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])
    leased = sub.pull(subscription=subscription, max_messages=1, return_immediately=True).received_messages
    assert len(leased) == 1

    assert pub.detach_subscription(request={"subscription": subscription}) == DetachSubscriptionResponse()
    got = sub.get_subscription(subscription=subscription)
    assert got.detached and got.topic == topic
    assert not sub.get_subscription(subscription=other).detached
    assert list(pub.list_topic_subscriptions(topic=topic)) == [other]

    before = table_versions(warehouse)
    with pytest.raises(SubscriptionDetached, match="detached"):
        sub.pull(subscription=subscription, max_messages=5, return_immediately=True)
    with pytest.raises(FailedPrecondition):  # SubscriptionDetached is a FailedPrecondition
        sub.acknowledge(subscription=subscription, ack_ids=[leased[0].ack_id])
    with pytest.raises(SubscriptionDetached):
        sub.modify_ack_deadline(subscription=subscription, ack_ids=[leased[0].ack_id], ack_deadline_seconds=30)
    with pytest.raises(SubscriptionDetached):
        sub.subscribe(subscription, lambda m: m.ack())
    assert table_versions(warehouse) == before
    b = sub.get_backlog(subscription)
    assert (b.num_unacked_messages, b.oldest_unacked_message_age) == (0, 0.0)
    refreshed = {s.subscription: s for s in sub.refresh_backlog()}
    assert refreshed[subscription].num_unacked_messages == 0 and refreshed[other].num_unacked_messages == 2

    # The keyword form, on a detached subscription: allowed, writes nothing more.
    before = table_versions(warehouse)
    pub.detach_subscription(subscription=subscription)
    assert table_versions(warehouse) == before
    with pytest.raises(NotFound):
        pub.detach_subscription(subscription=sub.subscription_path("local", "missing"))
    with pytest.raises(InvalidArgument, match="subscription"):
        pub.detach_subscription(request={"subscription": "bad"})
    with pytest.raises(InvalidArgument, match="request"):
        pub.detach_subscription(request={"subscription": subscription, "topic": topic})
    with pytest.raises(InvalidArgument, match="request"):
        sub.create_subscription(request={"name": sub.subscription_path("local", "born"), "topic": topic, "detached": True})
    assert table_versions(warehouse) == before


def test_a_pull_that_read_the_registry_before_the_detach_fans_out_nothing(pub: PublisherClient, sub: SubscriberClient, topic: str, subscription: str, warehouse: str) -> None:
    engine = open_engine(warehouse, engine="delta-rs")
    registry = Registry(engine, clock=time.time)
    stale = registry.subscription(subscription)  # read before the detach: not detached
    pub.publish_batch(topic, [{"data": b"x"}] * 3)  # not fanned out yet: no pull ran
    pub.detach_subscription(subscription=subscription)
    pub.publish_batch(topic, [{"data": b"y"}] * 2)
    # The stale record passes every check; the cursor, moved past every version in the
    # commit that dropped the backlog, leaves it nothing to fan out.
    assert DeltaTable(f"{warehouse}/deliveries").transaction_version(cursor_app_id(stale.sub_uid)) == DETACHED_CURSOR
    assert operations.pull(engine, stale, max_messages=10, lease_seconds=10, clock=time.time) == []
    assert rows_of(warehouse, stale.sub_uid) == 0


def test_a_detach_cut_between_its_commits_is_inert_and_finished_by_detaching_again(pub: PublisherClient, sub: SubscriberClient, topic: str, subscription: str, warehouse: str) -> None:
    pub.publish_batch(topic, [{"data": b"x"}] * 4)
    sub.pull(subscription=subscription, max_messages=1, return_immediately=True)  # fans out all 4, leases 1
    engine = open_engine(warehouse, engine="delta-rs")
    rec = Registry(engine, clock=time.time).detach_subscription(subscription)  # what a crash after commit 1 leaves
    assert rec.detached and rows_of(warehouse, rec.sub_uid) == 4
    # The rows left behind are inert: nothing delivers or counts them.
    with pytest.raises(SubscriptionDetached):
        sub.pull(subscription=subscription, max_messages=5, return_immediately=True)
    assert sub.get_backlog(subscription).num_unacked_messages == 0
    before = table_versions(warehouse)
    pub.detach_subscription(subscription=subscription)  # detaching again drops them, in one commit
    after = table_versions(warehouse)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"deliveries": 1}
    assert rows_of(warehouse, rec.sub_uid) == 0


def test_the_push_job_stops_pushing_a_detached_subscription(spark, pub: PublisherClient, psub: SubscriberClient, topic: str, warehouse: str) -> None:
    from deltabus.push.job import DeliveryJob

    with Endpoint() as gone_ep, Endpoint() as kept_ep:
        gone = psub.subscription_path("local", "push-gone")
        kept = psub.subscription_path("local", "push-kept")
        psub.create_subscription(name=gone, topic=topic, push_config={"push_endpoint": gone_ep.url})
        psub.create_subscription(name=kept, topic=topic, push_config={"push_endpoint": kept_ep.url})
        pub.publish_batch(topic, [{"data": b"first"}])
        job = DeliveryJob(spark, settings(warehouse))
        try:
            assert job.process(None, 1).delivered == 2
            # Pushing is use (expiration policies): the job recorded it for both.
            registry = Registry(open_engine(warehouse, engine="delta-rs", create=False), clock=time.time)
            assert registry.subscription(gone).last_active is not None and registry.subscription(kept).last_active is not None
            job.drain()
            pub.detach_subscription(subscription=gone)
            assert {r.name for r in job.push_subscriptions().values()} == {kept}
            pub.publish_batch(topic, [{"data": b"second"}] * 3)
            assert job.process(None, 2).delivered == 3
            job.drain()
        finally:
            job.close()
        assert len(gone_ep.snapshot()) == 1 and len(kept_ep.snapshot()) == 4
        assert sorted(json.loads(r.body)["message"]["data"] for r in kept_ep.snapshot()).count("c2Vjb25k") == 3  # base64 "second"


def test_a_version_2_subscriptions_table_gains_the_detached_column(warehouse: str) -> None:
    # A subscriptions table as issue 13 left it: versions 1 and 2's columns, version 2
    # recorded, and one row (its topic long gone).
    v2 = pa.schema([f for layer in SUBSCRIPTIONS.layers[:2] for f in layer])
    uri = f"{warehouse}/subscriptions"
    DeltaTable.create(uri, v2, name="subscriptions", configuration={SCHEMA_VERSION_KEY: "2"}, raise_if_key_not_exists=False)
    row = {f.name: None for f in v2} | {
        "name": "projects/local/subscriptions/old", "sub_uid": "sold", "topic": "projects/local/topics/old",
        "topic_uid": "told", "ack_deadline_seconds": 20, "start_version": 0,
    }
    write_deltalake(uri, pa.Table.from_pylist([row], schema=v2), mode="append")
    pub = PublisherClient(warehouse=warehouse)  # opens (and migrates) the warehouse
    sub = SubscriberClient(warehouse=warehouse)
    try:
        dt = DeltaTable(uri)
        assert dt.metadata().configuration[SCHEMA_VERSION_KEY] == str(SUBSCRIPTIONS.version)  # 3 and later
        assert [f.name for f in dt.schema().fields] == SUBSCRIPTIONS.schema.names
        old = sub.get_subscription(subscription="projects/local/subscriptions/old")
        assert old.detached is False and old.ack_deadline_seconds == 20  # null reads as not detached
        assert old.expiration_policy.ttl == 31 * 86400  # version 4 (issue 15): null reads as the default policy
        pub.detach_subscription(subscription=old.name)
        assert sub.get_subscription(subscription=old.name).detached
    finally:
        pub.stop()
        sub.close()


def test_the_cli_detaches_and_shows_it(warehouse: str, capsys: pytest.CaptureFixture[str]) -> None:
    from deltabus.cli import main

    env: dict[str, str] = {"DELTABUS_ENGINE": "delta-rs"}  # "auto" would pick delta-spark: the tests' session has the jars (23 s)
    assert main(["--warehouse", warehouse, "topics", "create", "orders"], environ=env) == 0
    assert main(["--warehouse", warehouse, "subscriptions", "create", "orders-sub", "--topic", "orders"], environ=env) == 0
    capsys.readouterr()
    assert main(["--warehouse", warehouse, "subscriptions", "detach", "orders-sub"], environ=env) == 0
    assert "detached subscription projects/local/subscriptions/orders-sub" in capsys.readouterr().out
    assert main(["--warehouse", warehouse, "subscriptions", "get", "orders-sub"], environ=env) == 0
    assert json.loads(capsys.readouterr().out)["detached"] is True
    assert main(["--warehouse", warehouse, "subscriptions", "detach", "missing-sub"], environ=env) == 1
    assert "not found" in capsys.readouterr().err
