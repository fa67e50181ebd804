"""The storage contract every engine (delta-rs embedded, delta-spark on clusters) fulfils.

Domain code only speaks this: read a snapshot, MERGE into it pinned to a literal
partition, append, read the change feed. ``transact`` reruns a whole
read-modify-write when Delta reports a conflicting concurrent commit.

Engines share warehouses: a table either engine creates has the same schema, partitioning,
properties and protocol (legacy reader 1 / writer 2, or writer 4 with change data feed, no
table features; tests/integration/test_table_protocol.py pins them), so each engine reads
and writes the other's tables, checkpoints included. An engine must not turn on a table
feature the other cannot read (v2 checkpoints, deletion vectors, row tracking, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Protocol, Sequence, TypeVar, Union

import pyarrow as pa
import pyarrow.compute as pc

from ..config import ConcreteEngine

if TYPE_CHECKING:  # pragma: no cover
    from .clock import CommitObserver

T = TypeVar("T")

_SAFE_LITERAL = re.compile(r"^[A-Za-z0-9_\-]+$")


class WriteRaced(Exception):
    """A committed write found that part of it did not apply, because the table moved between
    the snapshot it was decided on and the write's own read (a compare-and-set clause
    refused rows). Every engine's ``transact`` treats it as a conflict and reruns the whole
    read-decide-write on a fresh snapshot."""


@dataclass(frozen=True, slots=True)
class MatchedUpdate:
    set: Mapping[str, str]
    when: str | None = None


@dataclass(frozen=True, slots=True)
class MatchedDelete:
    when: str | None = None


@dataclass(frozen=True, slots=True)
class NotMatchedInsert:
    values: Mapping[str, str]
    when: str | None = None


Clause = Union[MatchedUpdate, MatchedDelete, NotMatchedInsert]


class AppTxn(NamedTuple):
    """A Delta application transaction: `app_id` has reached `version` on a table.

    Versions of one app id only grow; a write carrying (app_id, v) is done once the table
    records app_id at v or later. delta-rs records it but does not skip a repeat (measured:
    re-committing version 5 appended the rows again), so ``txn_done`` is checked on the snapshot
    the write then commits on. Two commits carrying one app id conflict (measured, delta-rs
    1.6.6: the second fails with "Concurrent transaction failed"), so of two racing writers
    one reruns and then finds the version done.
    """

    app_id: str
    version: int


def txn_done(snap: "Snapshot", txn: AppTxn | tuple[str, int]) -> bool:
    """Whether `snap`'s table already records `txn`'s app id at its version or later."""
    have = snap.txn_version(txn[0])
    return have is not None and have >= int(txn[1])


def literal(value: str) -> str:
    """A SQL string literal for an internal id; refuses anything but [A-Za-z0-9_-]."""
    if not _SAFE_LITERAL.match(value):
        raise ValueError(f"unsafe literal {value!r}")
    return f"'{value}'"


class Snapshot(Protocol):
    """One version of one table; a merge on it conflicts with anything committed since."""

    # Whether ``append`` with an application transaction commits on exactly this snapshot,
    # so that another commit of that app id since makes it conflict (delta-rs: the write goes
    # through the snapshot's own handle). delta-spark's writer reads the table again, so a
    # commit landing after the snapshot's check can go unseen: False there.
    appends_on_snapshot: bool

    @property
    def version(self) -> int: ...

    def read(
        self,
        columns: Sequence[str] | None = None,
        partition: str | None = None,
        filter: pc.Expression | None = None,
        prune: str | None = None,
    ) -> pa.Table: ...

    def read_first(
        self,
        limit: int,
        sort_keys: Sequence[tuple[str, str]],
        columns: Sequence[str],
        partition: str | None = None,
        filter: pc.Expression | None = None,
        skip_files: "Callable[[pa.Table], pa.Array] | None" = None,
        key_range: tuple[object, object] | None = None,
    ) -> pa.Table: ...

    def file_stats(self, partition: str | None = None) -> pa.Table:
        """The data files of the snapshot (of one partition): Delta's flattened add actions,
        ``path``, ``num_records``, ``min.<col>``, ``max.<col>``, ``null_count.<col>``."""
        ...

    def merge(
        self,
        source: pa.Table,
        on: str,
        clauses: Sequence[Clause],
        app_txn: tuple[str, int] | Sequence[tuple[str, int]] | None = None,
    ) -> Mapping[str, int]:
        """MERGE `source` into the table; returns its counts, on every engine under
        delta-rs's names: ``num_target_rows_inserted``, ``num_target_rows_updated``,
        ``num_target_rows_deleted`` (an engine may add others)."""
        ...

    def commit_txns(self, app_txns: Sequence[tuple[str, int]]) -> None: ...

    def append(self, data: pa.Table, app_txn: AppTxn | tuple[str, int] | None = None) -> None:
        """Append `data`, recording `app_txn` in the same commit. Skips nothing itself:
        callers check ``txn_done`` on this snapshot first (``Engine.append`` does)."""
        ...

    def delete(self, predicate: str) -> None: ...

    def overwrite(self, data: pa.Table) -> None: ...

    def txn_version(self, app_id: str) -> int | None: ...

    def changes(
        self, start: int, end: int, columns: Sequence[str], partition: str | None = None
    ) -> pa.Table: ...


class Engine(Protocol):
    name: ConcreteEngine  # what "auto" resolved to; compared as this Literal, never as a bare str
    warehouse: str
    # What a write raises when a concurrent commit conflicts with it (transact reruns on these).
    conflict_errors: tuple[type[BaseException], ...]

    def ensure_tables(self) -> None: ...

    def snapshot(self, table: str) -> Snapshot: ...

    def transact(self, table: str, fn: Callable[[Snapshot], T], *, what: str) -> T: ...

    def append(self, table: str, data: pa.Table, *, app_txn: AppTxn | tuple[str, int] | None = None) -> bool:
        """Append `data` to `table` (a blind append: it never conflicts with other appends).

        With `app_txn` the append is idempotent: it commits together with the application
        transaction, and is skipped (returns False) when the table already records that app
        id at that version or later. Returns whether rows were committed.
        """
        ...

    def version(self, table: str) -> int: ...

    def table_uri(self, table: str) -> str: ...

    def observe_commits(self, observer: "CommitObserver") -> None:
        """Report this engine's commits to `observer` where the engine can tell their log
        file's stamp (delta-rs on a file system); an engine that cannot reports nothing
        (``storage/clock.py``: the clock then probes)."""
        ...


def partition_files(actions: Any, column: str | None, partition: str | None) -> pa.Table:
    """Flattened add actions (any Arrow-exportable table) as pyarrow, of one partition if given."""
    table = actions if isinstance(actions, pa.Table) else pa.table(actions)
    if partition is not None and column is not None and table.num_rows:
        table = table.filter(pc.equal(table[f"partition.{column}"], partition))
    return table


def read_by_ids(snap: "Snapshot", ids: Sequence[str] | pa.Array, columns: Sequence[str], partition: str | None = None) -> pa.Table:
    """The rows (`columns`) whose message_id is one of `ids`, in message-id order, opening
    only the files whose message_id range (the log's statistics) overlaps the wanted ids,
    lowest first, and stopping once all are found: the cost follows the ids, not the table.

    The column is compared cast to string: delta-rs's MERGE writes message_id as
    string_view, and a plain isin() then fails in pyarrow's statistics pruning
    ("greater_equal (string, string_view)", measured with deltalake 1.6.6). `ids` must not
    be empty (callers answer that case with their own empty table)."""
    wanted = pc.unique(ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(ids), pa.string()))
    lo, hi = pc.min(wanted).as_py(), pc.max(wanted).as_py()

    def outside(actions: pa.Table) -> pa.Array:
        if "max.message_id" not in actions.column_names or "min.message_id" not in actions.column_names:
            return pa.array([False] * actions.num_rows)
        return pc.or_(pc.less(actions["max.message_id"], lo), pc.greater(actions["min.message_id"], hi))

    return snap.read_first(
        len(wanted), [("message_id", "ascending")], columns, partition=partition,
        filter=pc.field("message_id").cast(pa.string()).isin(wanted), skip_files=outside, key_range=(lo, hi),
    )


def first_rows(table: pa.Table, limit: int, sort_keys: Sequence[tuple[str, str]]) -> pa.Table:
    """The first `limit` rows of `table` in `sort_keys` order."""
    if table.num_rows == 0:
        return table
    order = pc.sort_indices(table, list(sort_keys))
    return table.take(order[:limit])


def txn_list(app_txn: tuple[str, int] | Sequence[tuple[str, int]] | None) -> list[tuple[str, int]]:
    """A merge's ``app_txn`` argument (one (app id, version) pair, several, or None) as a list."""
    if not app_txn:
        return []
    if isinstance(app_txn[0], str):
        return [app_txn]  # type: ignore[list-item]
    return list(app_txn)  # type: ignore[arg-type]
