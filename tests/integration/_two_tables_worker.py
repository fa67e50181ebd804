"""A two-table change shaped like dead-lettering, run in its own process by test_two_tables.py.

Table ``moves_source`` (partitioned by ``part``) holds rows with a delivery-attempt count;
the rows of partition ``s1`` with ``attempts >= 5`` are given up: copied to
``moves_target`` (partition ``dlq``) and deleted from the source, through a
``keyed_steps.MarkedMove``. One run: recover what an earlier run left unfinished, decide,
mark (commit 1), copy (commit 2), drop (commit 3). ``KILL_AT`` names where the process
SIGKILLs itself instead of going on.

Usage: python _two_tables_worker.py KILL_AT WAREHOUSE...   (KILL_AT: none or one of KILL_POINTS)
Runs on each warehouse in turn (one fresh process can be the next run of several killed
ones); prints one JSON line per warehouse: {"recovered": [keys], "key": this run's key or null}.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pyarrow as pa
import pyarrow.compute as pc

from deltabus.storage.delta_rs import DeltaRsEngine
from deltabus.storage.engine import MatchedUpdate, Snapshot
from deltabus.storage.keyed_steps import MarkedMove
from deltabus.storage.tables import TableSpec

KILL_POINTS = ("before-first", "after-first", "after-second", "after-third")
PARTITION = "s1"
GIVE_UP_AT = 5

SOURCE = TableSpec(
    "moves_source",
    layers=(
        (
            pa.field("part", pa.string(), nullable=False),
            pa.field("id", pa.string(), nullable=False),
            pa.field("attempts", pa.int32()),
            pa.field("payload", pa.string()),
            pa.field("mark", pa.int64()),
        ),
    ),
    partition_by=("part",),
)
TARGET = TableSpec(
    "moves_target",
    layers=(
        (
            pa.field("part", pa.string(), nullable=False),
            pa.field("id", pa.string(), nullable=False),
            pa.field("payload", pa.string()),
            pa.field("source_part", pa.string()),
            pa.field("source_attempts", pa.int32()),
        ),
    ),
    partition_by=("part",),
)


def carry(rows: pa.Table, key: int) -> pa.Table:
    """The dead-letter copies of the marked rows: a function of the rows alone."""
    n = rows.num_rows
    return pa.table(
        {
            "part": pa.array(["dlq"] * n, pa.string()),
            "id": rows["id"],
            "payload": rows["payload"],
            "source_part": rows["part"],
            "source_attempts": rows["attempts"],
        },
        schema=TARGET.schema,
    )


MOVE = MarkedMove(
    source=SOURCE.name,
    partition_column="part",
    partition=PARTITION,
    mark_column="mark",
    target=TARGET.name,
    app_id=f"move-{PARTITION}",
    carry=carry,
)


def open_engine(warehouse: str) -> DeltaRsEngine:
    return DeltaRsEngine(warehouse, extra_tables=(SOURCE, TARGET), auto_compact=None)


def mark(snap: Snapshot) -> int | None:
    """Commit 1: decide (unmarked rows given up) and mark them, in one MERGE."""
    intent = MOVE.begin(snap)
    rows = snap.read(columns=["part", "id", "attempts", "mark"], partition=PARTITION)
    due = rows.filter(pc.and_(pc.greater_equal(rows["attempts"], GIVE_UP_AT), pc.is_null(rows["mark"])))
    if due.num_rows == 0:
        return None
    on = f"t.part = '{PARTITION}' AND t.part = s.part AND t.id = s.id"
    snap.merge(due.select(["part", "id"]), on, [MatchedUpdate(intent.set, when="t.mark IS NULL")], app_txn=intent.txn)
    return intent.key


def run(warehouse: str, kill_at: str) -> dict[str, object]:
    def point(name: str) -> None:
        if kill_at == name:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    engine = open_engine(warehouse)
    recovered = MOVE.recover(engine)
    point("before-first")
    key = engine.transact(SOURCE.name, mark, what="mark rows to move")
    point("after-first")
    if key is not None:
        MOVE.copy(engine, key)
        point("after-second")
        MOVE.drop(engine, key)
    point("after-third")
    return {"recovered": recovered, "key": key}


if __name__ == "__main__":
    kill_arg, warehouses = sys.argv[1], sys.argv[2:]
    if kill_arg != "none" and kill_arg not in KILL_POINTS:
        raise SystemExit(f"KILL_AT: must be none or one of {', '.join(KILL_POINTS)}, got {kill_arg!r}")
    for warehouse_arg in warehouses:
        print(json.dumps(run(warehouse_arg, kill_arg)), flush=True)
