"""Fan-out from a stream micro-batch: pure row selection, and the cursor it commits."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from deltabus.delivery.cursor import FANOUT_COLUMNS, cursor_app_id
from deltabus.delivery.fanout import Fanout, batch_rows, prepare
from deltabus.timestamps import TS


def batch() -> pa.Table:
    """A push stream micro-batch: its version column is named ``version``."""
    return pa.table(
        {
            "topic_uid": pa.array(["t1", "t2", "t1", "t1"], pa.string()),
            "message_id": pa.array(["m4", "x1", "m2", "m3"], pa.string()),
            "publish_time": pa.array([4, 1, 2, 3], TS),
            "ordering_key": pa.array(["", "", "", ""], pa.string()),
            "size_bytes": pa.array([1, 1, 1, 1], pa.int64()),
            "version": pa.array([9, 8, 7, 9], pa.int64()),
        }
    )


def test_batch_rows_of_one_topic_after_the_cursor_named_message_version() -> None:
    rows = batch_rows(batch(), "t1", 7)
    assert tuple(rows.column_names) == FANOUT_COLUMNS
    assert rows["message_id"].to_pylist() == ["m4", "m3"]  # m2 (version 7) was fanned out already
    assert prepare(rows)["message_id"].to_pylist() == ["m3", "m4"]  # same version: by id


def test_filter_hook_drops_messages_but_not_the_cursor() -> None:
    rows = prepare(batch_rows(batch(), "t1", 0), keep=lambda t: pc.not_equal(t["message_id"], "m3"))
    assert rows["message_id"].to_pylist() == ["m2", "m4"]
    fan = Fanout(rows, 6, 9)
    assert fan.txns("u1") == [(cursor_app_id("u1"), 9)]
    assert Fanout(rows.slice(0, 0), 9, 9).txns("u1") == []


def test_whole_versions_keeps_whole_versions_within_the_limit() -> None:
    from deltabus.delivery.fanout import whole_versions

    versions = pa.array([5, 5, 6, 6, 6, 8, 9, 9], pa.int64())  # 7 holds none of this topic
    assert whole_versions(versions, 8, 4) == 9  # all of them fit
    assert whole_versions(versions, 5, 4) == 6  # 5 and 6 (5 rows); 8 would make 6
    assert whole_versions(versions, 6, 4) == 8  # 5, 6 and 8: version 7 (no rows) is covered too
    assert whole_versions(versions, 4, 4) == 5  # 6 would make 5 rows
    assert whole_versions(versions, 1, 4) == 5  # the first version alone is over: it goes whole (the cursor moves)
    assert whole_versions(pa.array([], pa.int64()), 3, 4) == 4  # nothing read: the cursor stays
    assert whole_versions(versions, 1, 4, strict=True) == 4  # strict: an oversized first version waits
    assert whole_versions(versions, 5, 4, strict=True) == 6
