"""A Spark Python data source streaming the messages table; offsets are Delta versions.

``spark.readStream.format("deltabus_messages").load(<messages table URI>)`` yields the
messages committed in each micro-batch's version range (from delta-rs's change feed),
plus one marker row per batch (``message_id`` null) carrying the whole range in
``range_start`` / ``range_end``, so ``foreachBatch`` knows exactly which versions it covers,
even when none of them holds a message.

Offsets are ``{"version": v, "tick": t}``. The tick changes on every poll, so the query
runs a micro-batch on every trigger even without new messages: ack-deadline expiries and
the ends of push backoff are acted on while nothing is published.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition, SimpleDataSourceStreamReader
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from ..config import ConcreteEngine

NAME = "deltabus_messages"
VERSIONS_PER_PARTITION = 50
DEFAULT_MAX_VERSIONS_PER_BATCH = 1000

# An offset as this source makes it and Spark hands it back (through its JSON offset log):
# {"version": <Delta version>, "tick": <changes on every poll>}.
Offset = dict[str, int]
# One row of SCHEMA, in its column order.
Row = tuple[Any, ...]

SCHEMA = StructType(
    [
        StructField("topic_uid", StringType()),
        StructField("message_id", StringType()),
        StructField("publish_time", TimestampType()),
        StructField("ordering_key", StringType()),
        StructField("size_bytes", LongType()),
        StructField("version", LongType()),
        StructField("range_start", LongType()),
        StructField("range_end", LongType()),
    ]
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic_uid", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("ordering_key", pa.string()),
        pa.field("size_bytes", pa.int64()),
        pa.field("version", pa.int64()),
        pa.field("range_start", pa.int64()),
        pa.field("range_end", pa.int64()),
    ]
)


class VersionRange(InputPartition):
    def __init__(self, uri: str, first: int, last: int, batch_start: int, batch_end: int, marker: bool) -> None:
        self.uri = uri
        self.first = first  # inclusive
        self.last = last  # inclusive
        self.batch_start = batch_start
        self.batch_end = batch_end
        self.marker = marker


def _marker(p: VersionRange) -> pa.RecordBatch:
    cols: dict[str, Any] = {f.name: pa.nulls(1, f.type) for f in ARROW_SCHEMA}
    cols["range_start"] = pa.array([p.batch_start], pa.int64())
    cols["range_end"] = pa.array([p.batch_end], pa.int64())
    return pa.RecordBatch.from_pydict(cols, schema=ARROW_SCHEMA)


def read_range(p: VersionRange) -> Iterator[pa.RecordBatch]:
    if p.marker:
        yield _marker(p)
        return
    from ..storage.arrow import plain
    from ..storage.log_repair import open_table

    dt = open_table(p.uri)
    cols = ["topic_uid", "message_id", "publish_time", "ordering_key", "size_bytes", "_change_type", "_commit_version"]
    table = plain(dt.load_cdf(starting_version=p.first, ending_version=p.last, columns=cols))
    if table.num_rows == 0:
        return
    table = table.filter(pa.compute.equal(table["_change_type"], "insert"))
    n = table.num_rows
    out = pa.table(
        {
            "topic_uid": table["topic_uid"],
            "message_id": table["message_id"],
            "publish_time": table["publish_time"],
            "ordering_key": table["ordering_key"],
            "size_bytes": table["size_bytes"],
            "version": pa.compute.cast(table["_commit_version"], pa.int64()),
            "range_start": pa.array([p.batch_start] * n, pa.int64()),
            "range_end": pa.array([p.batch_end] * n, pa.int64()),
        },
        schema=ARROW_SCHEMA,
    )
    yield from out.to_batches(max_chunksize=65536)


class IdleSkip:
    """Whether a trigger may pass without a batch (``policy.idle_wake``): options
    ``idleHint`` (the job's hint file) and ``watch`` (JSON: table name -> URI of each
    watched table). Without them every trigger runs a batch. Picklable: it holds strings."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.path = options.get("idleHint") or None
        self.watch: dict[str, str] = json.loads(options["watch"]) if options.get("watch") else {}

    def __call__(self) -> bool:
        if self.path is None or not self.watch:
            return False
        from ..policy.idle_wake import may_skip
        from .idle_hint import read

        hint = read(self.path)
        if hint is None:
            return False
        try:
            versions = {t: _latest(uri) for t, uri in self.watch.items()}
        except Exception:  # a table that cannot be read now: run the batch (it will say why)
            return False
        return may_skip(hint, versions, time.time())


class MessagesStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.uri = options["path"]
        self.max_versions = int(options.get("maxVersionsPerBatch", DEFAULT_MAX_VERSIONS_PER_BATCH))
        self._last: int | None = None
        self._tick = 0
        self._idle = IdleSkip(options)

    def _latest_version(self) -> int:
        return _latest(self.uri)

    def initialOffset(self) -> Offset:
        # A new query starts at the current end; subscriptions catch up from their own cursors.
        return {"version": self._latest_version(), "tick": 0}

    def latestOffset(self) -> Offset:
        latest = self._latest_version()
        if self._last is not None:
            latest = min(latest, self._last + self.max_versions)
            if latest == self._last and self._idle():  # an idle job: no batch (policy.idle_wake)
                return {"version": latest, "tick": self._tick}
        self._tick = time.time_ns()
        return {"version": latest, "tick": self._tick}

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        a, b = int(start["version"]), int(end["version"])
        self._last, self._tick = b, int(end.get("tick", 0))
        parts: list[InputPartition] = [VersionRange(self.uri, a, b, a, b, marker=True)]
        for lo in range(a + 1, b + 1, VERSIONS_PER_PARTITION):
            hi = min(b, lo + VERSIONS_PER_PARTITION - 1)
            parts.append(VersionRange(self.uri, lo, hi, a, b, marker=False))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, VersionRange)
        return read_range(partition)

    def commit(self, end: Offset) -> None:
        self._last, self._tick = int(end["version"]), int(end.get("tick", 0))


def _read_version(uri: str) -> int:
    from ..storage.log_repair import open_table

    return open_table(uri).version()


def _latest(uri: str) -> int:
    """The messages table's newest version, through this process's log watcher when local:
    one stat of the next version's log file per trigger instead of opening the table (which
    reads the log since its last checkpoint; measured 14 ms against 9 us on a local table of
    30 versions), and a full read every ``RESYNC_INTERVAL``. A
    table in an object store is read each trigger as before (the watcher would re-read it at
    most every ``REMOTE_INTERVAL``, later than the trigger)."""
    from ..watch import local_log_dir, watcher

    if local_log_dir(uri) is None:
        return _read_version(uri)
    lw = watcher()
    lw.watch(uri, functools.partial(_read_version, uri))
    return lw.current([uri])[uri]


def _tuples(uri: str, a: int, b: int) -> Iterator[Row]:
    """Rows of versions (a, b] as tuples, then the batch's marker row."""
    for lo in range(a + 1, b + 1, VERSIONS_PER_PARTITION):
        hi = min(b, lo + VERSIONS_PER_PARTITION - 1)
        for batch in read_range(VersionRange(uri, lo, hi, a, b, marker=False)):
            cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            yield from zip(*cols)
    yield (None, None, None, None, None, None, a, b)


class SimpleMessagesStreamReader(SimpleDataSourceStreamReader):
    """Reads on the driver: no Spark tasks per trigger (measured ~0.5 s less per micro-batch).

    The rows are keys and small metadata, not payloads, so the driver handles them easily.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.uri = options["path"]
        self.max_versions = int(options.get("maxVersionsPerBatch", DEFAULT_MAX_VERSIONS_PER_BATCH))
        self._idle = IdleSkip(options)

    def initialOffset(self) -> Offset:
        return {"version": _latest(self.uri), "tick": 0}

    def read(self, start: Offset) -> tuple[Iterator[Row], Offset]:
        a = int(start["version"])
        b = min(_latest(self.uri), a + self.max_versions)
        if b == a and self._idle():  # an idle job: the same offset, so no batch (policy.idle_wake)
            return iter([]), dict(start)
        # Spark pickles the prefetched rows: a list, not a generator.
        return iter(list(_tuples(self.uri, a, b))), {"version": b, "tick": time.time_ns()}

    def readBetweenOffsets(self, start: Offset, end: Offset) -> Iterator[Row]:
        return iter(list(_tuples(self.uri, int(start["version"]), int(end["version"]))))

    def commit(self, end: Offset) -> None:
        pass


def _ignore_terminal_interrupt() -> None:
    """Spark runs a stream source's reader in a Python process of the driver JVM's own process
    group, so a terminal's Ctrl-C reached it and killed the query before the job could stop
    in order. The same goes for SIGTERM sent to the whole group, as systemd does by default
    (KillMode=control-group) and as the chaos suite stops the job: the runner died, the query
    failed with an EOFException and the job exited with a traceback. The driver stops the
    query; this process ignores SIGINT and SIGTERM (Spark ends it itself, SIGKILL still does)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class MessagesSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _ignore_terminal_interrupt()  # called in the stream's source runner process
        # Spark uses streamReader() when implemented and falls back to simpleStreamReader()
        # on NOT_IMPLEMENTED: option reader=partitioned reads on executors (huge batches on a
        # cluster); the default reads keys on the driver, with no Spark tasks per trigger.
        if self.options.get("reader", "simple") != "partitioned":
            from pyspark.errors import PySparkNotImplementedError

            raise PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"})
        return MessagesStreamReader(self.options)

    def simpleStreamReader(self, schema: StructType) -> SimpleDataSourceStreamReader:
        _ignore_terminal_interrupt()
        return SimpleMessagesStreamReader(self.options)


def register(spark: Any) -> None:
    spark.dataSource.register(MessagesSource)


def message_stream(
    spark: Any, engine: ConcreteEngine, uri: str, trigger_interval: float, *, idle_hint: str | None = None,
    watch: Mapping[str, str] | None = None,
) -> Any:
    """The push job's input stream for `engine`.

    delta-rs: this module's source (keys of each version range, a marker row, a tick per poll;
    with `idle_hint` and `watch`, no tick while the job's hint says it is idle and none of
    the watched tables moved: ``policy.idle_wake``).
    delta-spark: Spark's own Delta change-feed stream, unioned with a rate stream so a batch
    runs at least every trigger even when nothing is published; the job reads fan-out from
    the change feed itself, so only the pacing matters here.
    """
    if engine != "delta-spark":
        reader = spark.readStream.format(NAME)
        if idle_hint is not None and watch:
            reader = reader.option("idleHint", idle_hint).option("watch", json.dumps(dict(watch)))
        return reader.load(uri)
    from pyspark.sql import functions as F

    changes = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", "latest")
        .load(uri)
        .select(F.col("_commit_version").cast("long").alias("version"))
    )
    per_second = max(1, int(round(1.0 / max(trigger_interval, 0.05))))
    ticks = spark.readStream.format("rate").option("rowsPerSecond", per_second).load().select(F.lit(None).cast("long").alias("version"))
    return changes.unionByName(ticks)
