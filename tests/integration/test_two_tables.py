"""Changing two tables safely (storage/keyed_steps.py): a move of rows from one Delta table to
another, shaped like dead-lettering, killed with SIGKILL at every point between its commits and
recovered by a fresh process; plus the keyed append it rests on, on real tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltabus
from deltabus.storage import open_engine
from deltabus.storage.delta_rs import DeltaRsEngine
from deltabus.storage.engine import AppTxn, Engine
from deltabus.storage.keyed_steps import UnfinishedMove
from deltabus.storage.tables import MESSAGES, TS
from tests.integration import _two_tables_worker as worker
from tests.conftest import requires_delta
from tests.integration.test_engine_contract import delta_spark_tables, delta_spark_warehouse  # noqa: F401 - a fixture

WORKER = Path(worker.__file__)
# (part, id, attempts): s1 rows with attempts >= 5 move; s2's stay (another partition).
ROWS = [("s1", "m0", 5), ("s1", "m1", 1), ("s1", "m2", 7), ("s1", "m3", 5), ("s1", "m4", 0),
        ("s1", "m5", 9), ("s2", "m6", 5), ("s2", "m7", 6)]
MOVED = ["m0", "m2", "m3", "m5"]
# What a run killed at each point leaves: (marked source ids, target ids, source row count).
DIED_WITH = {
    "before-first": ([], [], 8),
    "after-first": (MOVED, [], 8),
    "after-second": (MOVED, MOVED, 8),
    "after-third": ([], MOVED, 4),
}


def make_tables(warehouse: str) -> None:
    DeltaTable.create(f"{warehouse}/{worker.SOURCE.name}", worker.SOURCE.schema, partition_by=["part"])
    DeltaTable.create(f"{warehouse}/{worker.TARGET.name}", worker.TARGET.schema, partition_by=["part"])
    parts, ids, attempts = zip(*ROWS)
    rows = pa.table(
        {"part": parts, "id": ids, "attempts": pa.array(attempts, pa.int32()),
         "payload": [f"payload of {i}" for i in ids], "mark": pa.nulls(len(ids), pa.int64())},
        schema=worker.SOURCE.schema,
    )
    write_deltalake(f"{warehouse}/{worker.SOURCE.name}", rows, mode="append")


def start(kill_at: str, *warehouses: str) -> subprocess.Popen[str]:
    # The child imports the deltabus this test imported, whatever the venv points at.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WORKER), kill_at, *warehouses], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def table(warehouse: str, name: str) -> dict[str, list[object]]:
    return DeltaTable(f"{warehouse}/{name}").to_pyarrow_table().sort_by("id").to_pydict()


def test_a_move_killed_at_any_point_is_finished_by_the_next_run_exactly_once(tmp_path: Path) -> None:
    warehouses = {point: str(tmp_path / point) for point in worker.KILL_POINTS}
    for warehouse in warehouses.values():
        make_tables(warehouse)
    # Each point in its own warehouse and process, all at once.
    killed = {point: start(point, w) for point, w in warehouses.items()}
    for point, proc in killed.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, f"{point}: exit {proc.returncode}\n{err}"
        assert out == "", point
        # It died where it says: each point leaves a different state behind.
        source, target = table(warehouses[point], worker.SOURCE.name), table(warehouses[point], worker.TARGET.name)
        marked = sorted(i for i, m in zip(source["id"], source["mark"]) if m is not None)
        assert (marked, target["id"], len(source["id"])) == DIED_WITH[point], point
    # The next run of every warehouse: one fresh process (none of them saw these tables).
    recovery = start("none", *warehouses.values())
    out, err = recovery.communicate(timeout=120)
    assert recovery.returncode == 0, err
    results = [json.loads(line) for line in out.splitlines()]
    assert len(results) == len(warehouses)
    for (point, warehouse), result in zip(warehouses.items(), results):
        source, target = table(warehouse, worker.SOURCE.name), table(warehouse, worker.TARGET.name)
        # Every given-up row is in the target exactly once, with its own content ...
        assert target["id"] == MOVED, point
        assert target["payload"] == [f"payload of {i}" for i in MOVED], point
        assert target["source_attempts"] == [5, 7, 5, 9], point
        # ... and gone from the source; nothing else moved, no mark is left behind.
        assert source["id"] == ["m1", "m4", "m6", "m7"], point
        assert source["mark"] == [None] * 4, point
        # What the next run did: finished the killed run's move when it died between commits,
        # or made the move itself when it died before the first; the target records that key.
        txn = DeltaTable(f"{warehouse}/{worker.TARGET.name}").transaction_version(worker.MOVE.app_id)
        if point in ("after-first", "after-second"):
            assert result == {"recovered": [txn], "key": None}, (point, result, txn)
        elif point == "before-first":
            assert result == {"recovered": [], "key": txn}, (point, result, txn)
        else:
            assert result == {"recovered": [], "key": None} and txn is not None, (point, result, txn)


def move_engine(warehouse: str) -> DeltaRsEngine:
    make_tables(warehouse)
    return worker.open_engine(warehouse)


def marked_key(engine: DeltaRsEngine) -> int:
    key = engine.transact(worker.SOURCE.name, worker.mark, what="mark")
    assert key is not None
    return key


def test_racing_recoveries_copy_once_and_a_late_step_is_skipped(tmp_path: Path) -> None:
    one, other = move_engine(str(tmp_path)), worker.open_engine(str(tmp_path))
    key = marked_key(one)
    barrier = threading.Barrier(2)
    copied: list[bool] = []

    def copy(engine: DeltaRsEngine) -> None:
        barrier.wait(timeout=30)
        copied.append(worker.MOVE.copy(engine, key))

    threads = [threading.Thread(target=copy, args=(e,)) for e in (one, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # Both saw the marks; the two appends carry one app id, so one conflicts, reruns, skips.
    assert sorted(copied) == [False, True]
    assert worker.MOVE.copy(one, key) is False  # a late step of the same move
    assert worker.MOVE.drop(other, key) == 4
    assert worker.MOVE.drop(one, key) == 0
    assert worker.MOVE.recover(one) == []
    assert table(str(tmp_path), worker.TARGET.name)["id"] == MOVED


def test_a_new_move_waits_for_the_unfinished_one_and_keys_grow(tmp_path: Path) -> None:
    engine = move_engine(str(tmp_path))
    key = marked_key(engine)
    before = engine.version(worker.SOURCE.name)
    with pytest.raises(UnfinishedMove, match=rf"unfinished moves \[{key}\]"):
        engine.transact(worker.SOURCE.name, worker.mark, what="mark again")
    assert engine.version(worker.SOURCE.name) == before  # refused before writing
    assert worker.MOVE.recover(engine) == [key]
    # Later rows give up too: a second move, with a larger key, is not taken for done.
    late = pa.table({"part": ["s1"], "id": ["m9"], "attempts": pa.array([6], pa.int32()),
                     "payload": ["payload of m9"], "mark": pa.nulls(1, pa.int64())}, schema=worker.SOURCE.schema)
    engine.append(worker.SOURCE.name, late)
    second = marked_key(engine)
    assert second > key
    worker.MOVE.finish(engine, second)
    assert table(str(tmp_path), worker.TARGET.name)["id"] == [*MOVED, "m9"]


@pytest.fixture(params=["delta-rs", "delta-spark"])
def any_engine(request: pytest.FixtureRequest, warehouse: str) -> Engine:
    """Each engine; delta-spark on a copy of the tables it created once for the run (see
    test_engine_contract.py), skipped with conftest's reason only where no jars could be had."""
    if request.param == "delta-spark":
        spark = request.getfixturevalue("spark")
        requires_delta(spark)
        delta_spark_warehouse(request.getfixturevalue("delta_spark_tables"), warehouse)
        return open_engine(warehouse, engine="delta-spark", spark=spark)
    return open_engine(warehouse, engine="delta-rs")


def test_append_with_an_app_transaction_commits_each_version_once(any_engine: Engine) -> None:
    engine = any_engine
    row = pa.table({"topic_uid": ["t"], "topic": ["projects/p/topics/t"], "message_id": ["1"], "data": [b"x"],
                    "attributes": pa.array([[]], MESSAGES.schema.field("attributes").type),
                    "ordering_key": [""], "publish_time": pa.array([0], TS), "size_bytes": [1]},
                   schema=MESSAGES.schema)
    assert engine.append("messages", row, app_txn=AppTxn("dlq-a", 3)) is True
    assert engine.append("messages", row, app_txn=AppTxn("dlq-a", 3)) is False  # a repeat
    assert engine.append("messages", row, app_txn=("dlq-a", 2)) is False  # an older one
    assert engine.append("messages", row, app_txn=("dlq-b", 1)) is True  # another app id
    assert engine.append("messages", row, app_txn=("dlq-a", 4)) is True
    assert engine.append("messages", row) is True  # without: a plain append, as before
    dt = DeltaTable(engine.table_uri("messages"))
    assert dt.to_pyarrow_table().num_rows == 4
    assert (dt.transaction_version("dlq-a"), dt.transaction_version("dlq-b")) == (4, 1)

