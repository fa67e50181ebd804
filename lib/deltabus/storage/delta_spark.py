"""The cluster engine: MERGEs, appends and deletes through delta-spark, distributed by Spark.

Used where the Delta JVM classes (``io.delta:delta-spark``) are on Spark's classpath.
Tables are the same Delta tables the embedded engine writes (created with the same
schemas, partitioning, properties and protocol: reader 1, writer 2, or 4 with change data
feed, no table features; see ``creation_properties``), so a warehouse can move between
engines, and pull clients outside Spark keep using delta-rs on it.

*Reads.* Every commit is Spark's; the delivery core's small reads of one pinned version
(the rows a pull may lease, the current state of the ids an ack names, a cursor's new
messages in the change feed) go through delta-rs, over the same log handle the snapshot
already holds for its version, and open only the files that can match. Measured here on
2 cores, a delta-spark pull of 50 messages spent 3-8 s of its 6-15 s in Spark reads at a
pinned version (``versionAsOf`` rebuilds that version's state in Spark jobs on every
read); through delta-rs the same reads take milliseconds. Where Spark reads a table
itself, it reads it with its own Delta reader: the push job's stream
(``readStream.format("delta")`` with the change feed) and the SQL views.

Two things delta-spark's public API does not offer, and how this engine makes up for it:

- *Pinned snapshots.* A delta-spark MERGE reads the table's latest version, not the one
  our decision was made on. Each snapshot holds a delta-rs handle of the log at its
  version; before a write it is compared with the latest version, and a change since the
  snapshot to the partitions the write touches (files added or removed there) or to an
  application transaction it sets raises ``StaleSnapshot``, which ``transact`` treats as
  a conflict and reruns. Commits to other partitions are no conflict, as in delta-rs.
  Commits overlapping the MERGE itself are caught by Delta's own conflict checker
  (``ConcurrentAppendException`` and friends). What is left is the moment between the
  check and the MERGE's own read. The delivery core's lease clause is a compare-and-set on
  ``delivery_attempt`` (``delivery/merge.py``), so a lease decided on a state that moved in
  that moment is not written: the table never holds two leases of one message. The MERGE's
  counts then show fewer updates (or inserts: a new message another writer fanned out
  first) than decided, and ``delivery.merge.commit`` raises ``LeasesRaced`` (a
  ``WriteRaced``). A pull or push batch then reads back which of its leases, of redelivered
  and of new messages, the table holds (``merge.applied_leases``: the attempt and
  lease_expires it wrote) and hands out those alone; a pull none of whose leases applied
  reruns on a fresh snapshot. Nothing is lost, and no applied lease of a pull or push batch
  waits out its deadline unused (before, a raced pull handed out none, and the mixed-engine
  split test found ten messages held for its 60 s deadline). ``deltabus serve`` runs on
  delta-rs only, whose MERGE applies exactly its snapshot; its group commit reruns.
- *Several application transactions in one commit.* delta-spark records one
  (``txnAppId``, ``txnVersion``) per commit. The MERGE carries the last one given
  (the push job's batch id, or a pull's fan-out cursor, which is the only one), and any
  others (fan-out cursors of a push batch) are committed right after it as empty
  appends. A crash between the two leaves a cursor behind its rows: the next batch
  fans those versions out again, and the MERGE's not-matched insert skips rows that
  are there. Their pushes had not started (they start after the commits), so nothing
  acked can come back.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..config import ConcreteEngine
from ..errors import Aborted
from ..policy.backoff import Backoff
from .delta_rs import DeltaRsSnapshot
from .engine import AppTxn, Clause, MatchedDelete, MatchedUpdate, NotMatchedInsert, WriteRaced, literal, txn_done, txn_list
from .tables import BY_NAME, SCHEMA_VERSION_KEY, TableSpec, plan_migration, recorded_version

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable as RsTable

    from .clock import CommitObserver
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
T = TypeVar("T")

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
ALLOW_ARBITRARY_PROPERTIES = "spark.databricks.delta.allowArbitraryProperties.enabled"
DELTA_CLASS = "io.delta.tables.DeltaTable"


# delta-spark's MERGE metrics under the names of the contract (delta-rs's): callers count
# acks, deadline changes and registry updates by them. Under its own names a delta-spark
# update counted 0, so modify_push_config raised NotFound and acks reported none.
METRIC_NAMES = {
    "num_inserted_rows": "num_target_rows_inserted",
    "num_updated_rows": "num_target_rows_updated",
    "num_deleted_rows": "num_target_rows_deleted",
}


class StaleSnapshot(Exception):
    """The table moved since the snapshot was taken: rerun the read-modify-write."""


def delta_jvm_available(spark: "SparkSession") -> bool:
    """Whether Spark's JVM can load delta-spark (``--packages io.delta:...`` or a cluster install)."""
    try:
        # Through the thread's context class loader: spark-submit puts --jars there, not on the
        # system class path that a one-argument Class.forName called from py4j searches
        # (measured: with ./spark-submit.sh --jars <delta jars> that said False on local[2] and
        # spark://, while the context loader loaded the class).
        jvm = spark._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()  # type: ignore[union-attr]
        jvm.java.lang.Class.forName(DELTA_CLASS, False, loader)  # type: ignore[union-attr]
        return True
    except Exception:
        return False


CONFLICT_EXCEPTIONS = (
    "DeltaConcurrentModificationException",
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
)


def _conflict_types() -> tuple[type[BaseException], ...]:
    """What ``transact`` reruns on. Each of delta-spark's conflict exceptions by name: in
    delta-spark 4.4's Python package they do not derive from
    ``DeltaConcurrentModificationException`` (``ConcurrentAppendException.__mro__`` is
    itself, ``PySparkException``, ``Exception``), so catching the base alone let a MERGE
    that lost a race on one partition fail the pull (measured in the mixed-engine test)."""
    import delta.exceptions as delta_errors

    found = tuple(getattr(delta_errors, name) for name in CONFLICT_EXCEPTIONS if hasattr(delta_errors, name))
    return (StaleSnapshot, WriteRaced, *found)


class DeltaSparkSnapshot:
    """One version of one table: reads at that version, writes only if nothing moved it."""

    appends_on_snapshot = False  # see Snapshot.appends_on_snapshot

    def __init__(self, engine: "DeltaSparkEngine", spec: TableSpec, log_handle: "RsTable") -> None:
        self._engine = engine
        self._spark = engine.spark
        self._spec = spec
        self._log = log_handle
        self._uri = engine.table_uri(spec.name)
        self._version = log_handle.version()
        self._committed = False
        # Reads at this version, through delta-rs on the same handle (see the module docstring).
        self._reader = DeltaRsSnapshot(spec, log_handle, self._uri)

    @property
    def version(self) -> int:
        return self._version

    def _partition_sql(self, partition: str | None) -> str | None:
        if partition is None:
            return None
        if self._spec.partition_column is None:
            raise ValueError(f"table {self._spec.name} is not partitioned")
        return f"{self._spec.partition_column} = {literal(partition)}"

    def read(
        self,
        columns: Sequence[str] | None = None,
        partition: str | None = None,
        filter: pc.Expression | None = None,
        prune: str | None = None,
    ) -> pa.Table:
        return self._reader.read(columns, partition, filter, prune)

    def file_stats(self, partition: str | None = None) -> pa.Table:
        return self._reader.file_stats(partition)

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
        return self._reader.read_first(limit, sort_keys, columns, partition, filter, skip_files, key_range)

    def _claim(self, partitions: Sequence[str] | None = None, app_ids: Sequence[str] = ()) -> None:
        """Refuse a second write, and a write on what moved since the snapshot.

        With `partitions` (the partition values the write touches), commits elsewhere in the
        table are no conflict: only files of those partitions and the `app_ids` it sets count.
        """
        if self._committed:
            raise RuntimeError(f"snapshot of {self._spec.name} at version {self._version} already committed")
        latest = self._engine._log_handle(self._spec.name)
        if latest.version() != self._version:
            column = self._spec.partition_column
            if partitions is None or column is None or moved(self._log, latest, column, partitions, app_ids):
                raise StaleSnapshot(f"{self._spec.name} moved from version {self._version} to {latest.version()}")
        self._committed = True

    def merge(
        self,
        source: pa.Table,
        on: str,
        clauses: Sequence[Clause],
        app_txn: tuple[str, int] | Sequence[tuple[str, int]] | None = None,
    ) -> Mapping[str, int]:
        from delta.tables import DeltaTable

        txns = txn_list(app_txn)
        column = self._spec.partition_column
        partitions = source[column].unique().to_pylist() if column and column in source.column_names else None
        prefix = self._spec.insert_only_prefix
        if partitions is not None and prefix is not None:
            # Only inserted into (the delivery history): what others added there since the
            # snapshot changes nothing this write decided, so they are not claimed.
            partitions = [p for p in partitions if not str(p).startswith(prefix)]
        self._claim(partitions, [a for a, _ in txns])
        src = self._spark.createDataFrame(source).alias("s")
        builder = DeltaTable.forPath(self._spark, self._uri).alias("t").merge(src, on)
        for c in clauses:
            if isinstance(c, MatchedUpdate):
                builder = builder.whenMatchedUpdate(condition=c.when, set=dict(c.set))
            elif isinstance(c, MatchedDelete):
                builder = builder.whenMatchedDelete(condition=c.when)
            elif isinstance(c, NotMatchedInsert):  # delta-spark's overloads take no condition=None
                if c.when is None:
                    builder = builder.whenNotMatchedInsert(values=dict(c.values))
                else:
                    builder = builder.whenNotMatchedInsert(condition=c.when, values=dict(c.values))
            else:  # pragma: no cover - exhaustive
                raise TypeError(c)
        with self._engine.txn(txns[-1] if txns else None):
            metrics = builder.execute()
        row = metrics.first() if metrics is not None else None
        got = {k: int(v) for k, v in (row.asDict().items() if row is not None else ()) if v is not None}
        if txns and not got:
            # delta-spark skips a write whose txnVersion is not above the one recorded for its
            # app id, silently: another writer recorded it after the check in _claim (found
            # by review: a seek, or a pull's leases, then did nothing and said it had). Rerun.
            raise StaleSnapshot(f"{self._spec.name}: the MERGE was skipped, {txns[-1][0]} was recorded meanwhile")
        self._engine.commit_txns(self._spec.name, txns[:-1])
        return {METRIC_NAMES.get(k, k): v for k, v in got.items()}

    def append(self, data: pa.Table, app_txn: AppTxn | tuple[str, int] | None = None) -> None:
        """Append `data`, with `app_txn` (delta-spark's ``txnAppId``/``txnVersion`` writer
        options) in the same commit. With an app transaction only a change of that app id
        since the snapshot makes it stale: appends conflict with nothing else."""
        if app_txn is None:
            self._claim()
            self._engine.write(self._spec.name, data, "append")
            return
        self._claim([], [app_txn[0]])
        self._engine.write(self._spec.name, data, "append", (app_txn[0], int(app_txn[1])))

    def commit_txns(self, app_txns: Sequence[tuple[str, int]]) -> None:
        self._claim()
        self._engine.commit_txns(self._spec.name, app_txns)

    def delete(self, predicate: str) -> None:
        from delta.tables import DeltaTable

        self._claim()
        DeltaTable.forPath(self._spark, self._uri).delete(predicate)

    def overwrite(self, data: pa.Table) -> None:
        self._claim()
        self._engine.write(self._spec.name, data, "overwrite")

    def txn_version(self, app_id: str) -> int | None:
        return self._log.transaction_version(app_id)

    def changes(self, start: int, end: int, columns: Sequence[str], partition: str | None = None) -> pa.Table:
        """Rows inserted in versions start..end (inclusive), with ``_commit_version``, from the change feed."""
        return self._reader.changes(start, end, columns, partition)


def moved(before: "RsTable", after: "RsTable", column: str, partitions: Sequence[str], app_ids: Sequence[str]) -> bool:
    """Whether anything in `partitions` (files added or removed) or any of `app_ids` changed
    between two versions of one table's log."""

    def files(dt: "RsTable") -> set[str]:
        actions = pa.table(dt.get_add_actions(flatten=True))
        key = f"partition.{column}"
        if key not in actions.column_names:
            return set(actions["path"].to_pylist())
        mask = pc.is_in(actions[key].cast(pa.string()), pa.array(list(partitions), pa.string()))
        return set(actions.filter(mask)["path"].to_pylist())

    if any(before.transaction_version(a) != after.transaction_version(a) for a in app_ids):
        return True
    return files(before) != files(after)


class DeltaSparkEngine:
    """Warehouse of Delta tables written by delta-spark on `spark`."""

    name: ConcreteEngine = "delta-spark"

    def __init__(
        self,
        warehouse: str,
        spark: "SparkSession",
        *,
        storage_options: Mapping[str, str] | None = None,
        backoff: Backoff = Backoff(initial=0.01, maximum=1.0),
        max_conflict_seconds: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if "://" not in warehouse:
            warehouse = os.path.abspath(warehouse)
        self.warehouse = warehouse.rstrip("/")
        self.spark = spark
        self._storage_options = dict(storage_options) if storage_options else None
        self._backoff = backoff
        self._max_conflict_seconds = max_conflict_seconds
        self._sleep = sleep
        self._local = threading.local()
        # Session confs are shared by every thread of the session: one txn-carrying write at a time.
        self._txn_lock = threading.Lock()
        self.conflict_errors = _conflict_types()

    def table_uri(self, table: str) -> str:
        return f"{self.warehouse}/{table}"

    def observe_commits(self, observer: "CommitObserver") -> None:
        """Reports nothing: this engine's commits happen in the JVM, which does not say which
        log file was its own. A ``StorageClock`` on it keeps storage time by probes alone
        (storage/clock.py)."""

    def ensure_tables(self) -> None:
        """Create the missing tables at the current schema version and migrate older ones, as
        the embedded engine does (``DeltaRsEngine.ensure_tables``): a table newer than the
        code raises ``FailedPrecondition`` before anything is written; an older one gets
        ``ALTER TABLE ... ADD COLUMNS`` for the columns it lacks, then ``SET TBLPROPERTIES``
        for its version. Tables are read through delta-rs (the log only); writes go
        through Spark SQL. Idempotent, and a racing migrator is re-read."""
        from deltalake import DeltaTable as RsTable

        existing: dict[str, RsTable] = {}
        for spec in BY_NAME.values():
            uri = self.table_uri(spec.name)
            if RsTable.is_deltatable(uri, storage_options=self._storage_options):
                dt = existing[spec.name] = RsTable(uri, storage_options=self._storage_options)
                recorded_version(spec, dt.metadata().configuration)  # newer than this code: refuse before any write
        for spec in BY_NAME.values():
            if spec.name in existing:
                self._migrate(spec, existing[spec.name])
            else:
                self._create(spec)

    def _create(self, spec: TableSpec) -> None:
        from delta.tables import DeltaTable
        from deltalake import DeltaTable as RsTable
        from pyspark.sql.pandas.types import from_arrow_schema

        builder = (
            DeltaTable.createIfNotExists(self.spark)
            .location(self.table_uri(spec.name))
            .addColumns(from_arrow_schema(spec.schema))
        )
        if spec.partition_by:
            builder = builder.partitionedBy(*spec.partition_by)
        for key, value in creation_properties(spec).items():
            builder = builder.property(key, value)
        with self._arbitrary_properties():
            builder.execute()
        # createIfNotExists leaves a table another process created first as it was: migrate it if older.
        self._migrate(spec, RsTable(self.table_uri(spec.name), storage_options=self._storage_options))

    @contextmanager
    def _arbitrary_properties(self) -> Iterator[None]:
        """Let the create inside set Delta properties this Delta version does not know.

        ``delta.targetFileSize`` is delta-rs's (deliveries' file size); Delta 4.4 refuses it at
        creation (measured: ``DELTA_UNKNOWN_CONFIGURATION``) unless
        ``spark.databricks.delta.allowArbitraryProperties.enabled``. The session setting is
        turned on for the one create and put back as it was, under the session-conf lock."""
        with self._txn_lock:
            conf = self.spark.conf
            before = conf.get(ALLOW_ARBITRARY_PROPERTIES, None)
            conf.set(ALLOW_ARBITRARY_PROPERTIES, "true")
            try:
                yield
            finally:
                if before is None:
                    conf.unset(ALLOW_ARBITRARY_PROPERTIES)
                else:
                    conf.set(ALLOW_ARBITRARY_PROPERTIES, before)

    def _migrate(self, spec: TableSpec, dt: "RsTable") -> None:
        """Add the columns the table lacks, then record its version (two commits, in that
        order: a recorded version always has its columns). A conflicting commit, or a column
        that appeared meanwhile (another migrator), is re-read and re-planned."""
        from deltalake import DeltaTable as RsTable
        from pyspark.errors import AnalysisException

        target = f"delta.`{self.table_uri(spec.name).replace('`', '``')}`"
        for attempt in range(MIGRATION_ATTEMPTS):
            plan = plan_migration(spec, [f.name for f in dt.schema().fields], dt.metadata().configuration)
            if plan is None:
                return
            try:
                if plan.add:
                    self.spark.sql(add_columns_sql(target, plan.add))
                    log.info("table %s: added columns %s", spec.name, ", ".join(f.name for f in plan.add))
                if plan.set_version:
                    self.spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('{SCHEMA_VERSION_KEY}' = '{plan.to_version}')")
                    log.info("table %s: schema version %d -> %d", spec.name, plan.from_version, plan.to_version)
            except self.conflict_errors as exc:
                log.debug("table %s: migration raced another writer (attempt %d): %s", spec.name, attempt + 1, exc)
            except AnalysisException as exc:
                if "already exists" not in str(exc).lower():
                    raise
                log.debug("table %s: a column was added meanwhile (attempt %d): %s", spec.name, attempt + 1, exc)
            dt = RsTable(self.table_uri(spec.name), storage_options=self._storage_options)
        raise Aborted(f"table {spec.name}: migration kept conflicting with other writers ({MIGRATION_ATTEMPTS} attempts)")

    def _log_handle(self, table: str) -> "RsTable":
        """This thread's delta-rs view of the table's log (versions and app transactions)."""
        from deltalake import DeltaTable as RsTable

        handles: dict[str, RsTable] | None = getattr(self._local, "handles", None)
        if handles is None:
            handles = self._local.handles = {}
        dt = handles.get(table)
        if dt is None:
            dt = handles[table] = RsTable(self.table_uri(table), storage_options=self._storage_options)
        else:
            dt.update_incremental()
        return dt

    def snapshot(self, table: str) -> DeltaSparkSnapshot:
        # A fresh handle per snapshot: the snapshot must keep its version while others move.
        from deltalake import DeltaTable as RsTable

        dt = RsTable(self.table_uri(table), storage_options=self._storage_options)
        return DeltaSparkSnapshot(self, BY_NAME[table], dt)

    def version(self, table: str) -> int:
        return self._log_handle(table).version()

    @contextmanager
    def txn(self, app_txn: tuple[str, int] | None) -> Iterator[None]:
        """Set delta-spark's txnAppId/txnVersion for the one write inside, then unset them."""
        if app_txn is None:
            yield
            return
        with self._txn_lock:
            conf = self.spark.conf
            conf.set(TXN_APP_ID, app_txn[0])
            conf.set(TXN_VERSION, str(int(app_txn[1])))
            try:
                yield
            finally:
                conf.unset(TXN_APP_ID)
                conf.unset(TXN_VERSION)

    def write(self, table: str, data: pa.Table, mode: str, app_txn: tuple[str, int] | None = None) -> None:
        df = self.spark.createDataFrame(data) if data.num_rows else self.spark.createDataFrame([], _spark_schema(BY_NAME[table]))
        writer = df.write.format("delta").mode(mode)
        if app_txn is not None:
            writer = writer.option("txnAppId", app_txn[0]).option("txnVersion", int(app_txn[1]))
        writer.save(self.table_uri(table))

    def commit_txns(self, table: str, app_txns: Sequence[tuple[str, int]]) -> None:
        """Record application-transaction versions: one empty append each (delta-spark takes one per commit)."""
        for app_txn in app_txns:
            self.write(table, BY_NAME[table].schema.empty_table(), "append", app_txn)

    def transact(self, table: str, fn: Callable[[DeltaSparkSnapshot], T], *, what: str) -> T:
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return fn(self.snapshot(table))
            except self.conflict_errors as exc:
                elapsed = time.monotonic() - started
                if elapsed > self._max_conflict_seconds:
                    raise Aborted(f"{what}: gave up after {attempt + 1} conflicting attempts in {elapsed:.1f}s: {exc}") from exc
                log.debug("%s: commit conflict on %s (attempt %d), retrying", what, table, attempt + 1)
                self._sleep(self._backoff.delay(attempt, random.random()))
                attempt += 1

    def append(self, table: str, data: pa.Table, *, app_txn: AppTxn | tuple[str, int] | None = None) -> bool:
        """A blind append: Delta resolves version races itself, and appends never conflict.

        With `app_txn`: skipped (False) when the table records the app id at that version or
        later (checked on the snapshot's log, then committed only if that app id has not moved
        since; delta-spark itself also skips a ``txnVersion`` it has already recorded).
        """
        if app_txn is None:
            self.write(table, data, "append")
            return True
        txn = app_txn

        def attempt(snap: DeltaSparkSnapshot) -> bool:
            if txn_done(snap, txn):
                return False
            snap.append(data, txn)
            return True

        return self.transact(table, attempt, what=f"append to {table}")


def creation_properties(spec: TableSpec) -> dict[str, str]:
    """The table properties delta-spark creates `spec`'s table with: the spec's own, plus the
    protocol delta-rs 1.6 gives the same table (legacy versions, no table features), so a
    table reads and writes the same whichever engine made it.

    Measured with Delta 4.4 on pyspark 4.1.4: left to itself, delta-spark created the change-
    feed table (messages) at reader 1 / writer 7 with the writer features invariants,
    changeDataFeed and appendOnly, where delta-rs writes reader 1 / writer 4 and no features;
    with ``delta.minWriterVersion`` = 4 it wrote 1/4 too. The others are 1/2 either way.
    The two ``delta.min*Version`` keys set the protocol; they are not kept in the table's
    configuration. tests/integration/test_table_protocol.py pins the result on both engines."""
    writer = "4" if spec.configuration.get("delta.enableChangeDataFeed") == "true" else "2"
    return {**spec.properties, "delta.minReaderVersion": "1", "delta.minWriterVersion": writer}


def _spark_schema(spec: TableSpec) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(spec.schema)


MIGRATION_ATTEMPTS = 20


def add_columns_sql(target: str, columns: Sequence[pa.Field]) -> str:
    """``ALTER TABLE target ADD COLUMNS (...)`` for Arrow fields, in Spark SQL types (the
    same mapping delta-spark creates tables with: ``from_arrow_schema``). Columns added by a
    migration are nullable."""
    from pyspark.sql.pandas.types import from_arrow_schema

    struct = from_arrow_schema(pa.schema(list(columns)))
    parts = [f"`{f.name.replace('`', '``')}` {f.dataType.simpleString()}" for f in struct.fields]
    return f"ALTER TABLE {target} ADD COLUMNS ({', '.join(parts)})"
