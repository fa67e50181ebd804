"""The embedded engine: commits to Delta with delta-rs (``deltalake``), no JVM needed."""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
import weakref
from typing import Callable, Mapping, Sequence, TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, SchemaMismatchError, TableNotFoundError

from ..config import ConcreteEngine
from ..errors import Aborted, StorageFull
from ..policy.backoff import Backoff
from .arrow import dataset, plain, row_groups_in, scan_threads
from .clock import CommitObserver, local_folder
from .commit_files import Inserted, inserted_files
from .log_repair import MISSING_HINTED, drop_stale_hint, open_table
from .maintenance import AutoCompact, LogCleanup, clean_log, compact_table, file_count, post_commit_hooks
from .engine import AppTxn, Clause, MatchedDelete, MatchedUpdate, NotMatchedInsert, WriteRaced, first_rows, literal, partition_files, txn_done, txn_list
from .tables import BY_NAME, SCHEMA_VERSION_KEY, TableSpec, plan_migration, recorded_version

log = logging.getLogger(__name__)
T = TypeVar("T")


class DeltaRsSnapshot:
    """A view of one table version over this thread's shared handle.

    Conflict detection is only sound if the MERGE runs on the version that was read,
    so every use checks the handle has not been moved by another snapshot since, and
    a snapshot commits at most once.
    """

    appends_on_snapshot = True

    def __init__(
        self,
        spec: TableSpec,
        dt: DeltaTable,
        uri: str,
        stats_cache: dict[str, tuple[int, pa.Table]] | None = None,
        observers: Sequence[CommitObserver] = (),
    ) -> None:
        self._spec = spec
        self._dt = dt
        self._uri = uri
        self._stats_cache = stats_cache
        # Told of each commit made here, with the stamp of the log file it wrote (storage/clock.py).
        folder = local_folder(uri) if observers else None
        self._observers = tuple(observers) if folder is not None else ()
        self._log_dir = os.path.join(folder, "_delta_log") if folder is not None else ""
        self._version = dt.version()
        self._committed = False
        self.written: set[str] = set()  # partition values this snapshot's commit wrote to
        self.committed_version: int | None = None  # the version an append made here wrote (the handle's, after it)

    def _wrote(self, data: pa.Table) -> None:
        col = self._spec.partition_column
        if col is not None and col in data.column_names and data.num_rows:
            self.written.update(v for v in pc.unique(data[col]).to_pylist() if v is not None)

    @property
    def version(self) -> int:
        return self._version

    def _observed(self, commit: Callable[[], T]) -> T:
        """Run `commit` (one commit on this snapshot's handle) and report it to the observers:
        their clocks just before and just after, and the stamp of the log file it wrote (the
        handle's version is the new one once delta-rs has committed)."""
        if not self._observers:
            return commit()
        before = [o.local() for o in self._observers]
        result = commit()
        after = [o.local() for o in self._observers]
        try:
            stamp_ns = os.stat(os.path.join(self._log_dir, f"{self._dt.version():020d}.json")).st_mtime_ns
        except OSError:  # cleaned already, or not where expected: this commit is not observed
            return result
        for o, b, a in zip(self._observers, before, after):
            try:
                o.committed(b, a, stamp_ns)
            except Exception:  # an observer must never fail a commit that happened
                log.exception("commit observer failed")
        return result

    def _check(self) -> None:
        if self._committed or self._dt.version() != self._version:
            raise RuntimeError(
                f"snapshot of {self._spec.name} at version {self._version} is stale: "
                "take a new snapshot (one commit per snapshot, no refresh in between)"
            )

    def _filter(self, partition: str | None, filter: pc.Expression | None) -> pc.Expression | None:
        expr = filter
        if partition is not None:
            col = self._spec.partition_column
            if col is None:
                raise ValueError(f"table {self._spec.name} is not partitioned")
            part = pc.field(col) == partition
            expr = part if expr is None else part & expr
        return expr

    def read(
        self,
        columns: Sequence[str] | None = None,
        partition: str | None = None,
        filter: pc.Expression | None = None,
        prune: str | None = None,
    ) -> pa.Table:
        """Rows matching partition and filter. ``prune`` is a SQL predicate on columns with file
        statistics: files whose stats cannot match are never opened."""
        self._check()
        predicates = [p for p in (self._partition_sql(partition), prune) if p]
        ds = dataset(self._dt, self._uri, " AND ".join(predicates) if predicates else None)
        table = ds.to_table(
            columns=list(columns) if columns else None, filter=self._filter(partition, filter), use_threads=scan_threads(self._uri)
        )
        return plain(table)

    def file_stats(self, partition: str | None = None) -> pa.Table:
        self._check()
        # The add actions of one version never change: keep the last version's per table
        # (flattening 1,000 files' statistics cost tens of ms on every push batch).
        cached = self._stats_cache.get(self._spec.name) if self._stats_cache is not None else None
        if cached is not None and cached[0] == self._version:
            actions = cached[1]
        else:
            actions = pa.table(self._dt.get_add_actions(flatten=True))
            if self._stats_cache is not None:
                self._stats_cache[self._spec.name] = (self._version, actions)
        return partition_files(actions, self._spec.partition_column, partition)

    def read_first(
        self,
        limit: int,
        sort_keys: Sequence[tuple[str, str]],
        columns: Sequence[str],
        partition: str | None = None,
        filter: pc.Expression | None = None,
        skip_files: Callable[[pa.Table], pa.Array] | None = None,
        key_range: tuple[object, object] | None = None,
    ) -> pa.Table:
        """The first `limit` rows (in `sort_keys` order) matching partition and filter, reading
        only the files that can hold them.

        Files are opened in order of their minimum of the first sort key (from the Delta
        log's statistics) and reading stops once no unopened file can hold a value below
        the `limit`-th row found: the cost follows `limit`, not the partition's size.
        `skip_files` gets the flattened add actions (``min.<col>``, ``null_count.<col>``,
        ...) and marks files that cannot hold a matching row. `key_range` (lo, hi): every
        matching row's first sort key lies within it (inclusive), so the row groups of an
        opened file whose statistics lie outside are not read.
        """
        self._check()
        key = sort_keys[0][0]
        if sort_keys[0][1] != "ascending":
            raise ValueError("read_first steers by the first sort key ascending")
        cols = list(dict.fromkeys([*columns, *(k for k, _ in sort_keys)]))
        actions = self.file_stats(partition)
        if skip_files is not None and actions.num_rows:
            actions = actions.filter(pc.invert(pc.fill_null(skip_files(actions), False)))
        empty = self._spec.schema.empty_table().select(cols)
        if actions.num_rows == 0 or limit <= 0:
            return empty.select(list(columns))
        lows = actions[f"min.{key}"]
        # Files without statistics first (they may hold anything), then by their minimum.
        actions = pa.concat_tables([actions.filter(pc.is_null(lows)), actions.filter(pc.is_valid(lows)).sort_by([(f"min.{key}", "ascending")])])
        open_file = self._file_opener(partition, cols, filter, None if key_range is None else (key, *key_range))
        found: list[pa.Table] = []
        rows = 0
        cutoff = None
        for path, low in zip(actions["path"].to_pylist(), actions[f"min.{key}"].to_pylist()):
            if cutoff is not None and low is not None and low > cutoff:
                break
            part = open_file(path)
            if part.num_rows:
                found.append(part)
                rows += part.num_rows
            if rows >= limit:
                merged = first_rows(pa.concat_tables(found), limit, sort_keys)
                found, rows = [merged], merged.num_rows
                cutoff = merged[key][limit - 1].as_py()
        if not found:
            return empty.select(list(columns))
        return first_rows(pa.concat_tables(found), limit, sort_keys).select(list(columns))

    def _file_opener(
        self, partition: str | None, cols: list[str], filter: pc.Expression | None, within: tuple[str, object, object] | None = None,
    ) -> Callable[[str], pa.Table]:
        """Reads one data file of the snapshot (a path from its add actions): `cols`, rows
        matching `filter` (the caller already picked the partition's files), from the row
        groups whose statistics of column `within[0]` overlap [`within[1]`, `within[2]`] only.

        On a local table each file is opened on its own: building the whole table's
        pyarrow dataset first cost O(files) and, at 500 files, half of a push batch.
        Other stores go through delta-rs's dataset."""
        root = self._local_root()
        if root is not None:
            read = self._local_reader(root, cols, filter, within)
            return lambda path: read(path, partition)
        ds = dataset(self._dt, self._uri, self._partition_sql(partition))
        fragments = {f.path.rsplit("/", 1)[-1]: f for f in ds.get_fragments()}
        expr = self._filter(partition, filter)

        def read_fragment(path: str) -> pa.Table:
            fragment = fragments.get(path.rsplit("/", 1)[-1])
            if fragment is None:  # pragma: no cover - log and dataset come from one snapshot
                raise RuntimeError(f"{self._spec.name}: file {path} of the log is missing from the dataset")
            return plain(row_groups_in(fragment, within).to_table(columns=cols, filter=expr, use_threads=False, schema=ds.schema))

        return read_fragment

    def _local_root(self) -> str | None:
        """The table's directory when it is on the local disk, else None."""
        return self._uri.removeprefix("file://") if "://" not in self._uri or self._uri.startswith("file://") else None

    def _local_reader(
        self, root: str, cols: list[str], filter: pc.Expression | None, within: tuple[str, object, object] | None = None,
    ) -> Callable[[str, str | None], pa.Table]:
        """Reads one data file under `root` (a path from the log) given its partition value:
        `cols` (the partition column filled with that value), rows matching `filter`, from
        the row groups ``row_groups_in`` keeps for `within`."""
        import pyarrow.dataset as pads
        import pyarrow.fs as pafs

        part_col = self._spec.partition_column
        fs = pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())
        fmt = pads.ParquetFileFormat()
        file_cols = [c for c in cols if c != part_col]
        schema = pa.schema([f for f in self._spec.schema if f.name != part_col])

        def read(path: str, partition_value: str | None) -> pa.Table:
            fragment = row_groups_in(fmt.make_fragment(unquote(path), filesystem=fs), within)
            table = plain(fragment.to_table(columns=file_cols, filter=filter, schema=schema))
            if part_col is not None and part_col in cols:
                value = pa.repeat(pa.scalar(partition_value, self._spec.schema.field(part_col).type), table.num_rows)
                table = table.append_column(part_col, value)
            return table.select(cols)

        return read

    def _partition_sql(self, partition: str | None) -> str | None:
        if partition is None:
            return None
        return f"{self._spec.partition_column} = {literal(partition)}"

    def merge(
        self,
        source: pa.Table,
        on: str,
        clauses: Sequence[Clause],
        app_txn: tuple[str, int] | Sequence[tuple[str, int]] | None = None,
    ) -> Mapping[str, int]:
        self._check()
        txns = txn_list(app_txn)
        props = CommitProperties(app_transactions=[Transaction(a, int(v)) for a, v in txns]) if txns else None
        # streamed_exec=False lets delta-rs bound the target scan by the source's key range
        # (file skipping on message_id stats): measured flat ~23 ms with 1 or 200 files,
        # against a scan of every file in the partition when streamed.
        merger = self._dt.merge(
            source, on, source_alias="s", target_alias="t", commit_properties=props, streamed_exec=False,
            post_commithook_properties=post_commit_hooks(self._version),
        )
        for c in clauses:
            if isinstance(c, MatchedUpdate):
                merger = merger.when_matched_update(dict(c.set), predicate=c.when)
            elif isinstance(c, MatchedDelete):
                merger = merger.when_matched_delete(predicate=c.when)
            elif isinstance(c, NotMatchedInsert):
                merger = merger.when_not_matched_insert(dict(c.values), predicate=c.when)
            else:  # pragma: no cover - exhaustive
                raise TypeError(c)
        self._committed = True
        metrics = self._observed(merger.execute)
        self._wrote(source)
        return metrics

    def append(self, data: pa.Table, app_txn: AppTxn | tuple[str, int] | None = None) -> None:
        """Append `data` on this snapshot's handle, with `app_txn` in the same commit (the
        handle that ``txn_done`` read: a commit since is a lost race delta-rs retries, or a
        conflict when it carried the same app id)."""
        self._check()
        self._committed = True
        props = CommitProperties(app_transactions=[Transaction(app_txn[0], int(app_txn[1]))]) if app_txn else None
        hooks = post_commit_hooks(self._version)  # expired-log listing skipped: storage/maintenance.py
        self._observed(lambda: write_deltalake(self._dt, data, mode="append", commit_properties=props, post_commithook_properties=hooks))
        self.committed_version = self._dt.version()
        self._wrote(data)

    def commit_txns(self, app_txns: Sequence[tuple[str, int]]) -> None:
        """Commit only application-transaction versions (an empty MERGE would not commit).

        An empty blind append: it conflicts with nothing but another commit of the same app id.
        """
        self._check()
        self._committed = True
        props = CommitProperties(app_transactions=[Transaction(a, int(v)) for a, v in app_txns])
        hooks = post_commit_hooks(self._version)  # expired-log listing skipped: storage/maintenance.py
        self._observed(lambda: write_deltalake(self._dt, self._spec.schema.empty_table(), mode="append", commit_properties=props,
                                               post_commithook_properties=hooks))

    def delete(self, predicate: str) -> None:
        self._check()
        self._committed = True
        hooks = post_commit_hooks(self._version)  # expired-log listing skipped: storage/maintenance.py
        self._observed(lambda: self._dt.delete(predicate, post_commithook_properties=hooks))

    def overwrite(self, data: pa.Table) -> None:
        self._check()
        self._committed = True
        hooks = post_commit_hooks(self._version)  # expired-log listing skipped: storage/maintenance.py
        self._observed(lambda: write_deltalake(self._dt, data, mode="overwrite", post_commithook_properties=hooks))

    def txn_version(self, app_id: str) -> int | None:
        self._check()
        return self._dt.transaction_version(app_id)

    def changes(self, start: int, end: int, columns: Sequence[str], partition: str | None = None) -> pa.Table:
        """Rows inserted in versions start..end (inclusive), with ``_commit_version``.

        On a local table whose versions only added files, those files are read directly
        (storage/commit_files.py says why); otherwise delta-rs's change feed."""
        self._check()
        root = self._local_root()
        if root is not None:
            files = inserted_files(os.path.join(root, "_delta_log"), start, end, self._spec.partition_column, partition)
            if files is not None:
                return self._read_inserted(root, files, list(columns))
        predicate = self._partition_sql(partition)
        cols = list(dict.fromkeys([*columns, "_change_type", "_commit_version"]))
        reader = self._dt.load_cdf(starting_version=start, ending_version=end, columns=cols, predicate=predicate)
        table = plain(reader)
        table = table.filter(pc.equal(table["_change_type"], "insert")).select([*columns, "_commit_version"])
        return table.set_column(len(columns), "_commit_version", pc.cast(table["_commit_version"], pa.int64()))

    def _read_inserted(self, root: str, files: Sequence[Inserted], columns: list[str]) -> pa.Table:
        """`columns` of the data files `files` (from ``inserted_files``),
        with ``_commit_version``: the change feed's inserts of those versions."""
        read = self._local_reader(root, columns, None)
        out_schema = pa.schema([*(self._spec.schema.field(c) for c in columns), pa.field("_commit_version", pa.int64())])
        parts = []
        for version, path, value in files:
            table = read(path, value)
            table = table.append_column("_commit_version", pa.repeat(pa.scalar(version, pa.int64()), table.num_rows))
            parts.append(table.cast(out_schema))
        if not parts:
            return out_schema.empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


class DeltaRsEngine:
    """Warehouse of Delta tables written with delta-rs.

    Each thread keeps its own DeltaTable handle per table and brings it up to date
    incrementally before use (cheap: only new log entries are read).
    """

    name: ConcreteEngine = "delta-rs"
    conflict_errors: tuple[type[BaseException], ...] = (CommitFailedError,)

    def __init__(
        self,
        warehouse: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        backoff: Backoff = Backoff(initial=0.002, maximum=0.25),
        max_conflict_seconds: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
        auto_compact: AutoCompact | None = AutoCompact(),
        log_cleanup: LogCleanup | None = LogCleanup(),
        clock: Callable[[], float] = time.time,
        extra_tables: Sequence[TableSpec] = (),
    ) -> None:
        """`extra_tables`: tables beyond the warehouse's own that snapshots, transact and
        append may name (the caller creates them; ``ensure_tables`` does not), e.g. a
        feature's or a test's own tables used with ``keyed_steps``. `log_cleanup`: how often
        the log of a table with ``log_keep_seconds`` is cleaned (local warehouses only), with
        `clock` for the files' ages."""
        if "://" not in warehouse:
            warehouse = os.path.abspath(warehouse)
        self.warehouse = warehouse.rstrip("/")
        self._storage_options = dict(storage_options) if storage_options else None
        self._backoff = backoff
        self._max_conflict_seconds = max_conflict_seconds
        self._sleep = sleep
        self._auto_compact = auto_compact
        self._log_cleanup = log_cleanup if "://" not in self.warehouse else None  # object stores list from an offset
        self._clock = clock
        self._local = threading.local()
        self._stats_cache: dict[str, tuple[int, pa.Table]] = {}  # table -> (version, add actions)
        self._specs: dict[str, TableSpec] = {**BY_NAME, **{t.name: t for t in extra_tables}}
        # Held weakly: every client made over this engine adds its clock, and a client gone
        # must cost its commits nothing (2,000 clients made a publish 3x slower).
        self._observers: "weakref.WeakSet[CommitObserver]" = weakref.WeakSet()
        self._observers_lock = threading.Lock()

    def observe_commits(self, observer: CommitObserver) -> None:
        """Report every commit this engine makes from now on to `observer` (a ``StorageClock``),
        with the stamp of the log file it wrote, while `observer` lives (held weakly); local
        warehouses only (an object store's commits are not reported). Adding one observer
        twice adds it once."""
        with self._observers_lock:
            self._observers.add(observer)

    def _live_observers(self) -> tuple[CommitObserver, ...]:
        with self._observers_lock:
            return tuple(self._observers)

    def table_uri(self, table: str) -> str:
        return f"{self.warehouse}/{table}"

    def ensure_tables(self) -> None:
        """Create the missing tables at the current schema version and migrate older ones.

        First every existing table's version is read: one above the code's raises
        ``FailedPrecondition`` and nothing is written. Then a missing table is created (with
        its ``deltabus.schemaVersion`` property) and an older one gets its missing columns,
        then its new version (``migrate_table``). Idempotent: a second call writes nothing.
        Safe with another process doing the same at once (a lost race is re-read)."""
        if "://" not in self.warehouse:
            os.makedirs(self.warehouse, exist_ok=True)
        existing: dict[str, DeltaTable] = {}
        for spec in BY_NAME.values():
            uri = self.table_uri(spec.name)
            if DeltaTable.is_deltatable(uri, storage_options=self._storage_options):
                dt = existing[spec.name] = self._open(spec.name)
                recorded_version(spec, dt.metadata().configuration)  # newer than this code: refuse before any write
        for spec in BY_NAME.values():
            if spec.name in existing:
                migrate_table(existing[spec.name], spec, functools.partial(self._open, spec.name))
            else:
                self._create(spec)

    def _create(self, spec: TableSpec) -> None:
        uri = self.table_uri(spec.name)
        try:
            DeltaTable.create(
                uri,
                spec.schema,
                mode="error",
                partition_by=list(spec.partition_by) or None,
                configuration=spec.properties,
                storage_options=self._storage_options,
                name=spec.name,
                # delta-rs refuses table properties it does not know (our schema version) unless told.
                raise_if_key_not_exists=False,
                # A create that loses version 0 to a racing creator must fail, not be retried as
                # version 1: delta-rs retries lost version races, which committed a second
                # CREATE TABLE on the table the other process had just made (seen 1 run in 6 of
                # test_processes_migrating_or_creating_at_once_all_succeed).
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except Exception:
            # Another process may have created it between our check and create: migrate it
            # if that process runs older code.
            if not DeltaTable.is_deltatable(uri, storage_options=self._storage_options):
                raise
            migrate_table(self._open(spec.name), spec, functools.partial(self._open, spec.name))

    def _open(self, table: str) -> DeltaTable:
        """A new handle on the table's latest version."""
        return open_table(self.table_uri(table), self._storage_options)

    def _handle(self, table: str) -> DeltaTable:
        handles: dict[str, DeltaTable] | None = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = {}
        dt = handles.get(table)
        if dt is None:
            try:
                dt = open_table(self.table_uri(table), self._storage_options)
            except TableNotFoundError:
                self.ensure_tables()
                dt = open_table(self.table_uri(table), self._storage_options)
            handles[table] = dt
        else:
            try:
                dt.update_incremental()
            except Exception as exc:  # its _last_checkpoint names a checkpoint gone since: open it anew (log_repair)
                if MISSING_HINTED not in str(exc):
                    raise
                dt = handles[table] = open_table(self.table_uri(table), self._storage_options)
        return dt

    def snapshot(self, table: str) -> DeltaRsSnapshot:
        return DeltaRsSnapshot(self._specs[table], self._handle(table), self.table_uri(table), self._stats_cache, self._live_observers())

    def version(self, table: str) -> int:
        return self._handle(table).version()

    def transact(self, table: str, fn: Callable[[DeltaRsSnapshot], T], *, what: str) -> T:
        """Run fn on a fresh snapshot; on a commit conflict, back off and rerun it whole."""
        started = time.monotonic()
        attempt = 0
        repaired = False
        while True:
            snap = self.snapshot(table)
            try:
                result = fn(snap)
                self._after_commit(snap)
                return result
            except (CommitFailedError, WriteRaced) as exc:
                elapsed = time.monotonic() - started
                if elapsed > self._max_conflict_seconds:
                    raise Aborted(
                        f"{what}: gave up after {attempt + 1} conflicting attempts in {elapsed:.1f}s: {exc}"
                    ) from exc
                log.debug("%s: commit conflict on %s (attempt %d), retrying", what, table, attempt + 1)
                self._sleep(self._backoff.delay(attempt, random.random()))
                attempt += 1
            except Exception as exc:
                # A table's _last_checkpoint names a checkpoint gone since (log_repair): mend it and
                # rerun once; every handle of this thread then opens again, from the log.
                if not repaired and MISSING_HINTED in str(exc):
                    for t in self._specs:  # (another process may have mended it first: rerun anyway)
                        drop_stale_hint(self.table_uri(t))
                    repaired = True
                    self._local.handles = {}
                    continue
                # A full disk: say so, not "Generic LocalFileSystem error" or a parquet error.
                if isinstance(exc, StorageFull) or not StorageFull.caused(exc):
                    raise
                raise StorageFull(what, self.table_uri(table)) from exc

    def _after_commit(self, snap: DeltaRsSnapshot) -> None:
        """Auto-compaction: every `every` commits, compact the partitions just written if they
        hold many files. Log cleanup: every ``LogCleanup.every`` commits, for a table with
        ``log_keep_seconds``."""
        if not snap._committed:
            return
        cleanup, keep = self._log_cleanup, snap._spec.log_keep_seconds
        if cleanup is not None and keep is not None and cleanup.due(snap._dt.version()):
            try:
                removed = clean_log(self.table_uri(snap._spec.name), self._clock(), keep)
                log.debug("cleaned %d log files of %s", removed, snap._spec.name)
            except OSError as exc:  # a cleanup that fails is retried by the next one
                log.debug("log cleanup of %s failed: %s", snap._spec.name, exc)
        policy = self._auto_compact
        if policy is None:
            return
        dt = snap._dt
        if not policy.due(dt.version()):
            return
        spec = snap._spec
        for part in sorted(snap.written) if spec.partition_column else [None]:
            try:
                if file_count(dt, spec.partition_column, part) < policy.min_files:
                    continue
                metrics = compact_table(dt, spec, part, target_size=policy.target_size)
                log.info("compacted %s%s: %s files into %s", spec.name, f" {part}" if part else "",
                         metrics.get("numFilesRemoved"), metrics.get("numFilesAdded"))
            except CommitFailedError:
                log.debug("compaction of %s %s lost to a concurrent commit; the next one will retry", spec.name, part)
            except Exception as exc:  # the commit before it landed: a full disk must not fail it
                if not StorageFull.caused(exc):
                    raise
                log.warning("compaction of %s %s skipped: no space left on device; the next one will retry", spec.name, part)
                return

    def append(self, table: str, data: pa.Table, *, app_txn: AppTxn | tuple[str, int] | None = None) -> bool:
        """Append (a blind append: it never conflicts semantically, only races for a version).

        delta-rs retries a lost version race 15 times back to back, which many concurrent
        publishers can exhaust; retry the whole append with jittered backoff after that.
        A failed attempt left no log entry, so a retry cannot duplicate rows.

        With `app_txn`: skipped (False) when the table records the app id at that version or
        later, checked on the snapshot the append then commits on; a concurrent commit of the
        same app id makes this one conflict, and the rerun finds it done.
        """

        def attempt(snap: DeltaRsSnapshot) -> bool:
            if app_txn is not None and txn_done(snap, app_txn):
                return False
            snap.append(data, app_txn)
            return True

        return self.transact(table, attempt, what=f"append to {table}")


MIGRATION_ATTEMPTS = 20


def migrate_table(dt: DeltaTable, spec: TableSpec, reopen: Callable[[], DeltaTable]) -> None:
    """Bring an existing table to the spec's schema version: add the columns it lacks (at the
    end, nullable: old rows read null), then set ``deltabus.schemaVersion``. Two commits, in
    that order, so a recorded version always has its columns; a crash between them is
    completed by the next open.

    Another process migrating at once makes one of ours fail ("Metadata changed since last
    commit", measured with deltalake 1.6.6, or a schema error when the column appeared in
    between): the table is re-read and re-planned, which then finds the work done. A table
    newer than the code raises FailedPrecondition before anything is written."""
    from deltalake.schema import Field

    for attempt in range(MIGRATION_ATTEMPTS):
        plan = plan_migration(spec, [f.name for f in dt.schema().fields], dt.metadata().configuration)
        if plan is None:
            return
        try:
            if plan.add:
                dt.alter.add_columns([Field.from_arrow(f) for f in plan.add])
                log.info("table %s: added columns %s", spec.name, ", ".join(f.name for f in plan.add))
            if plan.set_version:
                dt.alter.set_table_properties({SCHEMA_VERSION_KEY: str(plan.to_version)}, raise_if_not_exists=False)
                log.info("table %s: schema version %d -> %d", spec.name, plan.from_version, plan.to_version)
        except (CommitFailedError, SchemaMismatchError) as exc:
            log.debug("table %s: migration raced another writer (attempt %d): %s", spec.name, attempt + 1, exc)
        dt = reopen()
    raise Aborted(f"table {spec.name}: migration kept conflicting with other writers ({MIGRATION_ATTEMPTS} attempts)")
