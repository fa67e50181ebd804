"""`deltabus serve` DetachSubscription through the REAL google-cloud-pubsub client.

A detached subscription keeps existing (``detached`` true in Get/List), leaves the topic's
list of attached subscriptions, loses its backlog in one deliveries commit, refuses Pull,
StreamingPull, Acknowledge and ModifyAckDeadline with FAILED_PRECONDITION, and gets
nothing fanned out to it again, while the topic's other subscriptions go on unaffected.
"""

from __future__ import annotations

import time

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from google.api_core import exceptions as gexc
from google.protobuf import field_mask_pb2

from deltabus import SubscriberClient
from deltabus.delivery.cursor import DETACHED_CURSOR, cursor_app_id
from deltabus.registry import Registry
from deltabus.storage import open_engine
from tests.conftest import table_versions
from tests.integration.test_server_publish_pull import pull_all
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

T = f"projects/{PROJECT}/topics/detach-topic"
GONE = f"projects/{PROJECT}/subscriptions/detached-sub"
KEPT = f"projects/{PROJECT}/subscriptions/kept-sub"


def publish(gpub, n: int, tag: str) -> list[str]:
    return [gpub.publish(T, f"{tag}{i}".encode()).result(timeout=30) for i in range(n)]


def rows_of(warehouse: str, sub_uid: str) -> int:
    table = DeltaTable(f"{warehouse}/deliveries").to_pyarrow_table(columns=["sub_uid"])
    return int(pc.sum(pc.equal(table["sub_uid"], sub_uid)).as_py() or 0)


def uid_of(warehouse: str, name: str) -> str:
    return Registry(open_engine(warehouse, engine="delta-rs"), clock=time.time).subscription(name).sub_uid


@pytest.fixture
def two_subs(gpub, gsub) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(name=GONE, topic=T, ack_deadline_seconds=60)
    gsub.create_subscription(name=KEPT, topic=T)


def test_detach_drops_the_backlog_in_one_commit_and_refuses_delivery(serve_thread, two_subs, gpub, gsub, warehouse: str) -> None:
    publish(gpub, 5, "before")
    leased = pull_all(gsub, GONE, 2)  # two outstanding leases, three never delivered
    assert len(leased) == 2
    uid = uid_of(warehouse, GONE)
    assert rows_of(warehouse, uid) == 5

    before = table_versions(warehouse)
    gpub.detach_subscription(request={"subscription": GONE})
    after = table_versions(warehouse)
    # One commit marks it in the registry, ONE commit drops its rows (and fences its cursor).
    assert {k: after[k] - before[k] for k in after} == {
        "topics": 0, "subscriptions": 1, "messages": 0, "deliveries": 1, "backlog": 0, "backlog_history": 0,
        "snapshots": 0, "snapshot_messages": 0}
    assert rows_of(warehouse, uid) == 0
    assert DeltaTable(f"{warehouse}/deliveries").transaction_version(cursor_app_id(uid)) == DETACHED_CURSOR

    # It still exists, shown detached; it is no longer listed as attached to the topic.
    got = gsub.get_subscription(subscription=GONE)
    assert got.detached and got.topic == T and got.ack_deadline_seconds == 60
    listed = {s.name: s.detached for s in gsub.list_subscriptions(request={"project": f"projects/{PROJECT}"})}
    assert listed == {GONE: True, KEPT: False}
    assert list(gpub.list_topic_subscriptions(request={"topic": T})) == [KEPT]

    # Delivery on it is refused, and refusing writes nothing.
    before = table_versions(warehouse)
    with pytest.raises(gexc.FailedPrecondition, match="detached"):
        gsub.pull(subscription=GONE, max_messages=10, return_immediately=True)
    with pytest.raises(gexc.FailedPrecondition, match="detached"):
        gsub.acknowledge(subscription=GONE, ack_ids=[r.ack_id for r in leased])
    with pytest.raises(gexc.FailedPrecondition, match="detached"):
        gsub.modify_ack_deadline(subscription=GONE, ack_ids=[leased[0].ack_id], ack_deadline_seconds=0)
    assert table_versions(warehouse) == before

    # Nothing more is fanned out to it; the other subscription gets everything.
    publish(gpub, 3, "after")
    kept = pull_all(gsub, KEPT, 8)
    assert sorted(r.message.data for r in kept) == sorted([f"before{i}".encode() for i in range(5)] + [b"after0", b"after1", b"after2"])
    gsub.acknowledge(subscription=KEPT, ack_ids=[r.ack_id for r in kept])
    with pytest.raises(gexc.FailedPrecondition):
        gsub.pull(subscription=GONE, max_messages=10, return_immediately=True)
    assert rows_of(warehouse, uid) == 0
    with SubscriberClient(warehouse=warehouse) as own:
        b = own.get_backlog(GONE)
        assert (b.num_undelivered_messages, b.num_outstanding_messages, b.expired_ack_deadlines) == (0, 0, 0)
        assert b.oldest_unacked_message_age == 0.0
        assert own.get_backlog(KEPT).num_unacked_messages == 0


def test_streaming_pull_on_a_detached_subscription_fails_with_failed_precondition(serve_thread, two_subs, gpub, gsub) -> None:
    gpub.detach_subscription(request={"subscription": GONE})
    publish(gpub, 2, "m")
    received: list[object] = []
    future = gsub.subscribe(GONE, received.append)
    try:
        with pytest.raises(gexc.FailedPrecondition, match="detached"):
            future.result(timeout=30)
    finally:
        future.cancel()
    assert received == []


def test_an_open_stream_ends_when_its_subscription_is_detached(serve_thread, two_subs, gpub, gsub) -> None:
    received: list[object] = []

    def callback(m) -> None:
        received.append(m)
        m.ack()

    future = gsub.subscribe(GONE, callback)
    try:
        publish(gpub, 1, "first")
        give_up = time.monotonic() + 30
        while not received and time.monotonic() < give_up:
            time.sleep(0.05)
        assert len(received) == 1
        gpub.detach_subscription(request={"subscription": GONE})
        with pytest.raises(gexc.FailedPrecondition, match="detached"):
            future.result(timeout=30)
    finally:
        future.cancel()


def test_detach_errors_repeats_and_updates(serve_thread, two_subs, gpub, gsub, warehouse: str) -> None:
    before = table_versions(warehouse)
    with pytest.raises(gexc.NotFound):
        gpub.detach_subscription(request={"subscription": f"projects/{PROJECT}/subscriptions/missing"})
    with pytest.raises(gexc.InvalidArgument, match="subscription"):
        gpub.detach_subscription(request={"subscription": "subscriptions/no-project"})
    with pytest.raises(gexc.InvalidArgument, match="detached"):
        gsub.create_subscription(request={"name": f"projects/{PROJECT}/subscriptions/born-detached", "topic": T, "detached": True})
    assert table_versions(warehouse) == before

    gpub.detach_subscription(request={"subscription": GONE})
    detached = table_versions(warehouse)
    gpub.detach_subscription(request={"subscription": GONE})  # again: allowed, and nothing left to write
    assert table_versions(warehouse) == detached

    # Its settings may still change; an update never attaches it again.
    new = gsub.update_subscription(request={
        "subscription": {"name": GONE, "labels": {"state": "retired"}},
        "update_mask": field_mask_pb2.FieldMask(paths=["labels"]),
    })
    assert new.detached and dict(new.labels) == {"state": "retired"}
    assert gsub.get_subscription(subscription=GONE).detached
    with pytest.raises(gexc.InvalidArgument, match="update_mask"):
        gsub.update_subscription(request={"subscription": {"name": GONE}, "update_mask": {"paths": ["detached"]}})
    # Deleting it works as for any subscription.
    gsub.delete_subscription(subscription=GONE)
    with pytest.raises(gexc.NotFound):
        gsub.get_subscription(subscription=GONE)
    assert not gsub.get_subscription(subscription=KEPT).detached
