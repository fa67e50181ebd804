"""A micro-batch's identity, replay check and rows (real Delta tables in a temp dir)."""

import pyarrow as pa

from deltabus.push.micro_batch import BATCH_COLUMNS, already_committed, app_id_for, batch_rows, checkpoint_for
from deltabus.storage import open_engine
from deltabus.storage.tables import DELIVERIES
from deltabus.timestamps import TS


def test_each_engine_keeps_its_own_checkpoint_and_app_id():
    assert checkpoint_for("/w/_checkpoints/", "delta-rs") == "/w/_checkpoints/deliver"
    assert checkpoint_for("/w/_checkpoints", "delta-spark") == "/w/_checkpoints/deliver-delta-spark"
    a, b = app_id_for("/w/_checkpoints/deliver"), app_id_for("/w/_checkpoints/deliver-delta-spark")
    assert a.startswith("deltabus-deliver-") and len(a) == len("deltabus-deliver-") + 16
    assert a != b and a == app_id_for("/w/_checkpoints/deliver")


def test_a_new_checkpoint_at_the_same_path_gets_a_new_app_id():
    # Its batch ids start at 0 again: they must not read as replays of the old checkpoint's.
    first, again = app_id_for("/w/_checkpoints/deliver", "q-1"), app_id_for("/w/_checkpoints/deliver", "q-2")
    assert first != again and first == app_id_for("/w/_checkpoints/deliver", "q-1")
    assert first != app_id_for("/w/_checkpoints/deliver")


def test_a_batch_is_a_replay_once_its_id_or_a_later_one_was_committed(warehouse):
    engine = open_engine(warehouse)
    assert not already_committed(engine.snapshot(DELIVERIES.name), "job", 0)
    engine.transact(DELIVERIES.name, lambda snap: snap.commit_txns([("job", 5)]), what="test")
    snap = engine.snapshot(DELIVERIES.name)
    assert already_committed(snap, "job", 5) and already_committed(snap, "job", 4)
    assert not already_committed(snap, "job", 6) and not already_committed(snap, "other", 0)


def test_batch_rows_span_the_versions_and_drop_rowless_markers(warehouse):
    engine = open_engine(warehouse)
    empty = batch_rows(None, engine)
    assert empty.rows.schema == BATCH_COLUMNS and empty.rows.num_rows == 0
    assert empty.first == empty.last == engine.version("messages")
    table = pa.table({
        "topic_uid": ["t", None], "message_id": ["m1", None], "publish_time": pa.array([0, None], TS),
        "ordering_key": ["", None], "size_bytes": pa.array([1, None], pa.int64()), "version": pa.array([3, None], pa.int64()),
        "range_start": pa.array([2, 2], pa.int64()), "range_end": pa.array([3, 4], pa.int64()),
    })
    calls = []
    got = batch_rows(lambda: calls.append(1) or table, engine)
    assert calls == [1] and (got.first, got.last) == (2, 4) and got.rows["message_id"].to_pylist() == ["m1"]
