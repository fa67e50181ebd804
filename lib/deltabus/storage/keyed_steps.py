"""Changing two tables safely: a marked move, carried on by steps keyed by app transactions.

Delta commits one table at a time. A change that must touch two (dead-lettering: publish a
copy to the dead-letter topic and ack on the source subscription; seek) is therefore split
into commits, and a crash between them must neither lose nor duplicate anything. The rule:

1. **Intent first, in the decision's own commit.** The MERGE that decides which rows move
   also marks them, in the source table, with the move's *key* (``mark_column`` = key), and
   records the app transaction (``app_id``, key) on the source. From then on, what every
   later step writes is a function of durable state: the rows marked with that key.
2. **Every later step is keyed.** The copy into the target table commits together with the
   app transaction (``app_id``, key) and is skipped when the target already records
   ``app_id`` at that key or later (``Engine.append(..., app_txn=)``). The last step deletes
   the source rows marked with the key (a MERGE pinned to the partition), which is
   idempotent by itself.
3. **Recovery re-runs unfinished moves.** A key still marked in the source is unfinished;
   ``recover`` runs its steps again, each one skipped if done. Any process may run it, at
   any time; the owner of the source partition runs it before it decides anew.

Marked rows belong to their move until it ends. The copy carries the rows still marked
with the key when it runs (not the rows marked at commit 1), and the drop deletes those
still marked when it runs. So between commit 1 and the drop, no other path may change or
delete a marked row: a lease would deliver a message that is being moved (or already
copied), and an ack would make the copy skip it or, after the copy, count it twice. This
module cannot enforce that (it owns none of those paths): once a feature marks rows, the
source's own readers must leave marked rows out (issue 13's dead-lettering: lease
selection and outcomes must exclude rows whose ``mark_column`` is set).

Why marked rows (not an outbox table, not keys alone): the intent must be in the same commit
as the decision, and that commit is on the source table; marks are rows already there, so
the copy's content needs no history (time travel would depend on vacuum and log retention)
and no third table. The cost is one nullable int64 column on the source.

Keys: an intent recorded on a source snapshot at version v gets key v + 1. Intents of one
source partition are serialised (two MERGEs in one partition conflict, and both carry
``app_id``: measured with delta-rs 1.6.6, each alone makes the second commit fail), and
each is taken after the previous one committed, so keys of one ``app_id`` strictly grow,
as Delta's app-transaction versions must. ``begin`` refuses a snapshot that still holds
marked rows: a later key's copy must never reach the target before an earlier key's, or
the earlier one would be skipped as done. One ``app_id`` per source partition, so
different partitions (subscriptions) never share one.

Layering: this module knows tables, partitions and Arrow rows, nothing of subscriptions or
messages. The caller supplies ``carry``, turning marked source rows into target rows. The
source is partitioned by a string column (partition values are SQL literals here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FailedPrecondition, InvalidArgument
from .engine import AppTxn, Engine, MatchedDelete, Snapshot, literal

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_APP_ID = re.compile(r"^[A-Za-z0-9_\-:.]+$")


class UnfinishedMove(FailedPrecondition):
    """The source partition still holds rows marked by an earlier move: ``recover`` first."""

    def __init__(self, source: str, partition: str, keys: list[int]) -> None:
        self.keys = keys
        super().__init__(f"{source} partition {partition} holds unfinished moves {keys}: recover them before a new one")


class Intent(NamedTuple):
    """What the decision MERGE must carry: mark its moving rows with ``set`` (a
    ``MatchedUpdate`` assignment) and commit with ``txn`` (last, if it carries others)."""

    key: int
    txn: AppTxn
    set: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class MarkedMove:
    """Rows of one source partition move to a target table, through marks and keyed steps.

    ``carry(rows, key)`` turns the source rows marked with `key` into the target rows; it
    must depend only on its arguments (and on durable, unchanging state), since recovery
    may call it again in another process. It is called with every marked row of the key.
    """

    source: str
    partition_column: str
    partition: str
    mark_column: str
    target: str
    app_id: str
    carry: Callable[[pa.Table, int], pa.Table]

    def __post_init__(self) -> None:
        for name in ("source", "partition_column", "mark_column", "target"):
            if not _IDENTIFIER.match(getattr(self, name)):
                raise InvalidArgument(name, f"must be an identifier ([A-Za-z_][A-Za-z0-9_]*), got {getattr(self, name)!r}")
        if self.source == self.target:
            raise InvalidArgument("target", "must differ from source (a move within one table is one MERGE)")
        try:
            literal(self.partition)
        except ValueError:
            raise InvalidArgument("partition", f"must match [A-Za-z0-9_-]+, got {self.partition!r}") from None
        if not _APP_ID.match(self.app_id):
            raise InvalidArgument("app_id", f"must match [A-Za-z0-9_-:.]+, got {self.app_id!r}")

    # -- the first commit --------------------------------------------------------------
    def pending(self, snap: Snapshot) -> list[int]:
        """Keys still marked in the source partition of `snap`, ascending."""
        marks = snap.read(columns=[self.mark_column], partition=self.partition, filter=pc.is_valid(pc.field(self.mark_column)))
        return sorted(int(k) for k in pc.unique(marks[self.mark_column]).to_pylist())

    def begin(self, snap: Snapshot) -> Intent:
        """The intent for a decision MERGE on `snap` (a snapshot of the source).

        Raises ``UnfinishedMove`` when `snap` still holds marked rows. The MERGE must pin
        the partition and carry ``Intent.txn``; its conflict with a concurrent intent makes
        ``transact`` rerun the whole decision on a new snapshot (and a new key).
        """
        keys = self.pending(snap)
        if keys:
            raise UnfinishedMove(self.source, self.partition, keys)
        key = snap.version + 1
        return Intent(key, AppTxn(self.app_id, key), {self.mark_column: str(key)})

    # -- the later steps ---------------------------------------------------------------
    def marked(self, snap: Snapshot, key: int) -> pa.Table:
        """The source rows of `snap` marked with `key`."""
        return snap.read(partition=self.partition, filter=pc.field(self.mark_column) == pa.scalar(key, pa.int64()))

    def copy(self, engine: Engine, key: int) -> bool:
        """Step 2: append ``carry`` of the rows marked `key` to the target, keyed by
        (app_id, key). False when done before (or when no row is marked `key` any more,
        which only a finished move leaves)."""
        rows = self.marked(engine.snapshot(self.source), key)
        if rows.num_rows == 0:
            return False
        return engine.append(self.target, self.carry(rows, key), app_txn=AppTxn(self.app_id, key))

    def drop(self, engine: Engine, key: int) -> int:
        """Step 3: delete the source rows marked `key` (run only after ``copy``). Returns
        how many there were; 0 when done before."""

        # A MERGE pinned to the partition, not a DELETE: delta-spark's snapshot check then
        # counts only this partition's changes as a conflict, as delta-rs does.
        part, mark = self.partition_column, self.mark_column
        source = pa.table({part: pa.array([self.partition], pa.string()), mark: pa.array([key], pa.int64())})
        on = f"t.{part} = {literal(self.partition)} AND t.{part} = s.{part} AND t.{mark} = s.{mark}"

        def attempt(snap: Snapshot) -> int:
            n = int(self.marked(snap, key).num_rows)
            if n:
                snap.merge(source, on, [MatchedDelete()])
            return n

        return engine.transact(self.source, attempt, what=f"drop moved rows of {self.source} {self.partition} key {key}")

    def finish(self, engine: Engine, key: int) -> None:
        """Every step after the intent, in order; each is skipped if done."""
        self.copy(engine, key)
        self.drop(engine, key)

    def recover(self, engine: Engine) -> list[int]:
        """Finish every move still marked in the source partition (oldest first); returns
        their keys. Safe to run from any process at any time, also concurrently."""
        keys = self.pending(engine.snapshot(self.source))
        for key in keys:
            self.finish(engine, key)
        return keys
