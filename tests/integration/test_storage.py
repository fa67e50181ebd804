"""The storage contract the domain code relies on, checked on the real engine."""

import threading

import pyarrow as pa
import pytest
from deltalake.exceptions import CommitFailedError

from deltabus.storage import MatchedUpdate, NotMatchedInsert, open_engine
from deltabus.storage.tables import DELIVERIES, TS


def rows(sub_uid, ids, attempt=0):
    n = len(ids)
    return pa.table(
        {
            "sub_uid": [sub_uid] * n,
            "message_id": ids,
            "message_version": pa.array([1] * n, pa.int64()),
            "publish_time": pa.nulls(n, TS),
            "ordering_key": [""] * n,
            "size_bytes": pa.array([1] * n, pa.int64()),
            "delivery_attempt": pa.array([attempt] * n, pa.int32()),
            "lease_expires": pa.nulls(n, TS),
            "dead_letter_key": pa.nulls(n, pa.int64()),  # deliveries schema version 2 (issue 13)
            **{f.name: pa.nulls(n, f.type) for f in DELIVERIES.layers[2]},  # version 3: the delivery history (issue 17)
        },
        schema=DELIVERIES.schema,
    )


INSERT = [NotMatchedInsert({c: f"s.{c}" for c in DELIVERIES.schema.names})]
BUMP = [MatchedUpdate({"delivery_attempt": "t.delivery_attempt + 1"})]


def on(uid):
    return f"t.sub_uid = '{uid}' AND t.message_id = s.message_id"


@pytest.fixture
def engine(warehouse):
    return open_engine(warehouse)


def test_same_partition_writers_conflict(engine, warehouse):
    other = open_engine(warehouse)  # its own handles, as another process would have
    engine.snapshot("deliveries").merge(rows("sa", ["1", "2"]), on("sa"), INSERT)
    a = engine.snapshot("deliveries")
    b = other.snapshot("deliveries")  # same version as a
    a.merge(rows("sa", ["1"]), on("sa"), BUMP)
    with pytest.raises(CommitFailedError):
        b.merge(rows("sa", ["2"]), on("sa"), BUMP)  # another row, same partition: still a conflict
    assert sorted((r["message_id"], r["delivery_attempt"]) for r in engine.snapshot("deliveries").read().to_pylist()) == [
        ("1", 1),
        ("2", 0),
    ]


def test_a_snapshot_refuses_to_commit_on_a_moved_handle(engine):
    a = engine.snapshot("deliveries")
    engine.snapshot("deliveries").merge(rows("sa", ["1"]), on("sa"), INSERT)  # same thread, same handle
    with pytest.raises(RuntimeError, match="stale"):
        a.merge(rows("sa", ["2"]), on("sa"), INSERT)


def test_different_partitions_never_conflict(engine, warehouse):
    a = engine.snapshot("deliveries")
    b = open_engine(warehouse).snapshot("deliveries")
    a.merge(rows("sa", ["1"]), on("sa"), INSERT)
    b.merge(rows("sb", ["1"]), on("sb"), INSERT)
    assert engine.snapshot("deliveries").read().num_rows == 2


def test_transact_reruns_conflicting_work_and_loses_nothing(engine):
    engine.snapshot("deliveries").merge(rows("sa", ["x"]), on("sa"), INSERT)
    errors = []

    def bump(times):
        try:
            for _ in range(times):
                engine.transact("deliveries", lambda s: s.merge(rows("sa", ["x"]), on("sa"), BUMP), what="bump")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=bump, args=(15,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    (row,) = engine.snapshot("deliveries").read(partition="sa").to_pylist()
    assert row["delivery_attempt"] == 45  # every increment committed exactly once


def test_app_transaction_is_committed_with_the_merge(engine):
    snap = engine.snapshot("deliveries")
    snap.merge(rows("sa", ["1"]), on("sa"), INSERT, app_txn=("cursor-sa", 7))
    assert engine.snapshot("deliveries").txn_version("cursor-sa") == 7
    assert engine.snapshot("deliveries").txn_version("cursor-other") is None


def test_read_returns_plain_arrow_types(engine, pub, topic):
    pub.publish_batch(topic, [{"data": b"x", "attributes": {"k": "v"}}])
    table = engine.snapshot("messages").read()
    for field in table.schema:
        assert not pa.types.is_string_view(field.type) and not pa.types.is_binary_view(field.type)
    changes = engine.snapshot("messages").changes(0, engine.version("messages"), ["message_id", "publish_time"])
    assert changes.schema.field("message_id").type == pa.string()
    assert changes.schema.field("_commit_version").type == pa.int64()
