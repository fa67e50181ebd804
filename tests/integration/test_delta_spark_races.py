"""delta-spark's MERGE reads the table again after the snapshot's check, and skips a write
whose application transaction was recorded meanwhile. Three windows found by review (issue
15), each forced here by running another writer right after the check (``_claim``): an
exactly-once ack, a seek and a snapshot create each used to report success for a change that
did not happen. The cluster group (delta-spark takes tens of seconds here)."""

from __future__ import annotations

import time

import pytest

from deltabus import SubscriberClient
from deltabus.errors import AcknowledgeError, AlreadyExists
from deltabus.storage import delta_spark, open_engine
from tests.conftest import ManualClock, requires_delta
from tests.integration.test_seek import b, drain, publish

pytestmark = pytest.mark.cluster
P = "local"


def after_claim(monkeypatch, table: str, action) -> list[object]:  # type: ignore[no-untyped-def]
    """Run `action` once, right after a delta-spark write on `table` passed its check."""
    real = delta_spark.DeltaSparkSnapshot._claim
    done: list[object] = []

    def claim(self, *a, **k):  # type: ignore[no-untyped-def]
        real(self, *a, **k)
        if not done and self._spec.name == table:
            done.append(action())

    monkeypatch.setattr(delta_spark.DeltaSparkSnapshot, "_claim", claim)
    return done


def spark_client(warehouse: str, spark, **kw) -> SubscriberClient:  # type: ignore[no-untyped-def]
    return SubscriberClient(engine=open_engine(warehouse, engine="delta-spark", spark=spark, create=False), **kw)


def test_an_exactly_once_ack_beaten_to_its_row_does_not_report_success(pub, warehouse, topic, spark, monkeypatch) -> None:
    requires_delta(spark)
    clock = ManualClock(time.time())
    y = SubscriberClient(warehouse=warehouse, clock=clock)
    name = y.subscription_path(P, "eod-spark")
    y.create_subscription(request={"name": name, "topic": topic, "enable_exactly_once_delivery": True})
    pub.publish_batch(topic, [{"data": b"m"}])
    x = spark_client(warehouse, spark, clock=clock)
    (got,) = x.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
    clock.advance(11)  # X's lease ran out; nobody has the message yet
    stolen = after_claim(monkeypatch, "deliveries",
                         lambda: y.pull(subscription=name, max_messages=1, return_immediately=True).received_messages)
    with pytest.raises(AcknowledgeError):
        x.acknowledge(subscription=name, ack_ids=[got.ack_id])  # rerun on a fresh snapshot: Y holds it now
    monkeypatch.undo()
    assert len(stolen[0]) == 1  # type: ignore[arg-type]
    y.acknowledge(subscription=name, ack_ids=[stolen[0][0].ack_id])  # type: ignore[index]
    x.close()
    y.close()


def test_a_seek_whose_cursor_was_recorded_meanwhile_is_not_skipped(pub, warehouse, topic, spark, monkeypatch) -> None:
    requires_delta(spark)
    y = SubscriberClient(warehouse=warehouse)
    name = y.subscription_path(P, "seek-spark")
    y.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["m1"])
    assert drain(y, name, ack=False) == b("m1")
    publish(pub, topic, ["m2"])  # not fanned out yet
    x = spark_client(warehouse, spark)
    raced = after_claim(monkeypatch, "deliveries",
                        lambda: y.pull(subscription=name, max_messages=10, return_immediately=True).received_messages)
    x.seek(subscription=name, time=time.time() + 3600)  # everything published so far counts as acked
    monkeypatch.undo()
    assert [m.message.data for m in raced[0]] == [b"m2"]  # type: ignore[attr-defined]  # Y fanned m2 out in the window
    assert drain(y, name) == []  # the seek reran and applied
    x.close()
    y.close()


def test_two_creates_of_one_snapshot_name_do_not_both_succeed(pub, sub, topic, warehouse, spark, monkeypatch) -> None:
    requires_delta(spark)
    name = sub.subscription_path(P, "snapsrc")
    sub.create_subscription(name=name, topic=topic)
    publish(pub, topic, ["a"])
    drain(sub, name, ack=False)
    x = spark_client(warehouse, spark)
    snap = sub.snapshot_path(P, "same")
    done = after_claim(monkeypatch, "snapshots", lambda: sub.create_snapshot(name=snap, subscription=name))
    with pytest.raises(AlreadyExists):
        x.create_snapshot(name=snap, subscription=name)
    monkeypatch.undo()
    assert done and [s.name for s in sub.list_snapshots(project=P)] == [snap]
    x.close()
