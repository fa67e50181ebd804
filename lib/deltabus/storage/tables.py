"""The Delta tables of a warehouse: names, schemas and their versions, partitioning, table properties.

Layout (see README "Storage layout" for the reasoning):
- topics, subscriptions: small registries, one row per live resource.
- messages: append-only, partitioned by topic_uid, change data feed on. Publishers
  only append, and appends never conflict in Delta.
- deliveries: per-subscription lease state, partitioned by sub_uid. One row per message
  fanned out to the subscription and not yet acked; an ack deletes the row. Every write
  is a MERGE pinned to a literal sub_uid, so work on different subscriptions never
  conflicts and concurrent work on one subscription is serialised by Delta's conflict check.
- backlog: one row per subscription, the latest figures (rewritten on refresh);
  backlog_history: every such write appended (append-only, never conflicts).

Schema versions. Each table's schema is a list of versions, each adding columns at the end
(nullable, so rows written before read them as null). Version 1 is round 1's layout; the
backlog tables' push fields (backoff_until ... last_error) are their version 2. A table
records its version in the Delta table property ``deltabus.schemaVersion``; a table without
it predates versioning and counts as version 1 (whatever columns it already has: migration
adds the missing ones by name, so a table that gained some columns before versioning
existed migrates all the same), and gets the property on its first open by this code. ``plan_migration`` decides, the engines' ``ensure_tables``
apply: first the missing columns, then the version property, so a table whose property says
N always has N's columns (a crash between the two leaves columns added and the old version,
which the next open completes). A table of a version above the code's is refused
(``FailedPrecondition``) before anything is written.

Why a table property: it travels with the table (a warehouse copied, or opened by another
engine, keeps it), it is read with the metadata every open reads anyway, and changing it is
a metadata-only commit that both delta-rs (``alter.set_table_properties``) and delta-spark
(``ALTER TABLE ... SET TBLPROPERTIES``) make; a side file would need its own atomicity.
Measured with deltalake 1.6.6: ``DeltaTable.create`` refuses keys it does not know unless
``raise_if_key_not_exists=False``; ``set_table_properties`` takes them.

The subscriptions table's columns come from the one declaration of a subscription's fields
(``deltabus.subscription_fields``), a leaf module of data that imports nothing of storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Sequence

import pyarrow as pa

from .. import subscription_fields
from ..errors import FailedPrecondition
from ..timestamps import TS

__all__ = [
    "TS",
    "STR_MAP",
    "PUSH_CONFIG",
    "SCHEMA_VERSION_KEY",
    "TableSpec",
    "Migration",
    "recorded_version",
    "plan_migration",
    "TOPICS",
    "SUBSCRIPTIONS",
    "MESSAGES",
    "DELIVERIES",
    "HISTORY_PREFIX",
    "BACKLOG",
    "BACKLOG_HISTORY",
    "SNAPSHOTS",
    "SNAPSHOT_MESSAGES",
    "ALL",
    "BY_NAME",
]

STR_MAP = subscription_fields.STR_MAP
PUSH_CONFIG = subscription_fields.PUSH_CONFIG

SCHEMA_VERSION_KEY = "deltabus.schemaVersion"


@dataclass(frozen=True, slots=True)
class FileLayout:
    """The files a compaction writes: about `target_size` bytes each, in row groups of at
    most `row_group_rows` rows."""

    target_size: int
    row_group_rows: int

    def __post_init__(self) -> None:
        if self.target_size < 1:
            raise ValueError(f"FileLayout.target_size: must be >= 1 byte, got {self.target_size}")
        if self.row_group_rows < 1:
            raise ValueError(f"FileLayout.row_group_rows: must be >= 1, got {self.row_group_rows}")


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table: ``layers[v - 1]`` holds the columns schema version ``v`` added.

    ``schema`` is every layer's columns in order (the current layout) and ``version`` the
    number of layers. ``configuration`` holds Delta's own table properties; ``properties``
    adds the schema version, and is what a new table is created with."""

    name: str
    layers: tuple[tuple[pa.Field, ...], ...]
    partition_by: tuple[str, ...] = ()
    configuration: Mapping[str, str] = field(default_factory=dict)
    # Seconds of log history the table's readers need (None: Delta's own 30 days); older
    # commit files before the latest checkpoint are deleted (storage/maintenance.py, "Log cleanup").
    log_keep_seconds: float | None = None
    # Partition values starting with this prefix only ever receive inserts (the deliveries
    # table's delivery history, ``delivery/history.py``): a write that only inserts there
    # claims none of them, so writers on different subscriptions adding history to the same
    # day partition never conflict (delta-spark's snapshot check, ``storage/delta_spark``).
    insert_only_prefix: str | None = None
    # How this engine's compactions lay out the table's files (None: delta-rs's defaults),
    # whatever the table's own properties say: a warehouse made before a layout changed gets it too.
    layout: "FileLayout | None" = None
    schema: pa.Schema = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.layers or not all(self.layers):
            raise ValueError(f"table {self.name}: every schema version adds at least one column")
        columns = [f for layer in self.layers for f in layer]
        if len({f.name for f in columns}) != len(columns):
            raise ValueError(f"table {self.name}: a column is declared twice")
        late = [f.name for layer in self.layers[1:] for f in layer if not f.nullable]
        if late:
            raise ValueError(f"table {self.name}: columns added after version 1 must be nullable: {late}")
        first = {f.name for f in self.layers[0]}
        if any(c not in first for c in self.partition_by):
            raise ValueError(f"table {self.name}: partition columns belong to version 1")
        object.__setattr__(self, "schema", pa.schema(columns))

    @property
    def partition_column(self) -> str | None:
        return self.partition_by[0] if self.partition_by else None

    @property
    def version(self) -> int:
        """The schema version this code writes."""
        return len(self.layers)

    @property
    def properties(self) -> dict[str, str]:
        """The table properties of a new table: Delta's configuration plus the schema version."""
        return {**self.configuration, SCHEMA_VERSION_KEY: str(self.version)}


class Migration(NamedTuple):
    """What bringing one existing table to its spec's version takes."""

    table: str
    from_version: int
    to_version: int
    add: tuple[pa.Field, ...]  # columns to add, at the end, in this order
    set_version: bool  # the version property is absent or older


def recorded_version(spec: TableSpec, properties: Mapping[str, str | None]) -> int:
    """The schema version a table's properties record (1 when absent: written before versions
    existed). A version above the code's raises FailedPrecondition: its columns and their
    meaning are unknown here, so nothing may be written to that warehouse."""
    raw = properties.get(SCHEMA_VERSION_KEY)
    if raw is None:
        return 1
    try:
        version = int(raw)
    except ValueError:
        raise FailedPrecondition(
            f"table {spec.name}: table property {SCHEMA_VERSION_KEY}={raw!r} is not a version number"
        ) from None
    if version > spec.version:
        raise FailedPrecondition(
            f"table {spec.name} is at schema version {version}, written by a newer deltabus "
            f"(this one knows version {spec.version}); upgrade deltabus to use this warehouse"
        )
    return version


def plan_migration(spec: TableSpec, columns: Sequence[str], properties: Mapping[str, str | None]) -> Migration | None:
    """What an existing table (its column names and table properties) needs to reach the
    spec's version, or None when it is there. Columns are matched by name: any the spec has
    and the table lacks are added, whatever version the table records."""
    version = recorded_version(spec, properties)
    have = set(columns)
    add = tuple(f for f in spec.schema if f.name not in have)
    # A table from before versioning gets the property even when it needs no column, so
    # that every table says which layout it has.
    stamp = properties.get(SCHEMA_VERSION_KEY) is None or version != spec.version
    if not add and not stamp:
        return None
    return Migration(spec.name, version, spec.version, add, stamp)


TOPICS = TableSpec(
    "topics",
    (
        (
            pa.field("name", pa.string(), nullable=False),
            pa.field("topic_uid", pa.string(), nullable=False),
            pa.field("labels", STR_MAP),
            pa.field("create_time", TS),
        ),
        # Version 2 (issue 15): the topic's message retention in seconds (null: none).
        (pa.field("message_retention_duration", pa.float64()),),
    ),
)

# Columns, types and versions: the declaration of a subscription's fields.
SUBSCRIPTIONS = TableSpec("subscriptions", subscription_fields.schema_layers())

MESSAGES = TableSpec(
    "messages",
    (
        (
            pa.field("topic_uid", pa.string(), nullable=False),
            pa.field("topic", pa.string()),
            pa.field("message_id", pa.string(), nullable=False),
            pa.field("data", pa.binary()),
            pa.field("attributes", STR_MAP),
            pa.field("ordering_key", pa.string()),
            pa.field("publish_time", TS),
            # data + attribute bytes, so backlog bytes need not read the payloads.
            pa.field("size_bytes", pa.int64()),
        ),
    ),
    partition_by=("topic_uid",),
    configuration={"delta.enableChangeDataFeed": "true"},
    # Payloads are looked up by message id (``read_by_ids``), a thousand at a time, and a
    # lookup reads whole row groups of the files whose id range holds the ids. With
    # delta-rs's defaults (100 MB files, 1M-row row groups) auto-compaction kept folding
    # every new file into one growing file of interleaved rows: at a backlog of 10M
    # messages (100-byte payloads, 1,000 a publish) the topic was one 10M-row file whose
    # every row group spanned the whole id range, a lookup of 1,000 ids took 450 ms, and
    # every 50th publish rewrote all 10M rows. Bounded files keep each one to a narrow id
    # range and leave it alone once full; small row groups let a lookup skip most of a file.
    layout=FileLayout(target_size=8 * 1024 * 1024, row_group_rows=16_384),
)

DELIVERIES = TableSpec(
    "deliveries",
    (
        (
            pa.field("sub_uid", pa.string(), nullable=False),
            pa.field("message_id", pa.string(), nullable=False),
            pa.field("message_version", pa.int64()),
            pa.field("publish_time", TS),
            pa.field("ordering_key", pa.string()),
            pa.field("size_bytes", pa.int64()),
            # 0 = never delivered; n = the n-th delivery holds (or held) the lease.
            pa.field("delivery_attempt", pa.int32()),
            # null = available now; otherwise the ack deadline of the current lease.
            pa.field("lease_expires", TS),
        ),
        # Version 2 (issue 13, dead-letter topics): the key of the ``MarkedMove`` the row
        # belongs to while it is being moved to a dead-letter topic; null otherwise. A
        # marked row is left alone by leases and outcomes until the move drops it.
        (pa.field("dead_letter_key", pa.int64()),),
        # Version 3 (issue 17, the delivery history): rows in the partitions
        # ``_attempts-<yyyy-mm-dd>`` (HISTORY_PREFIX; never a sub_uid) record one delivery
        # event each, written by the same commit that changed the delivery's state
        # (``delivery/history.py``). Their message_id is the message's and delivery_attempt
        # the attempt; these columns say the rest. Null on every delivery-state row.
        (
            pa.field("attempt_subscription", pa.string()),
            pa.field("attempt_outcome", pa.string()),
            pa.field("attempt_status", pa.string()),
            pa.field("attempt_latency_ms", pa.float64()),
            pa.field("attempt_worker", pa.string()),
            pa.field("attempt_time", TS),
        ),
    ),
    partition_by=("sub_uid",),
    # Small files (~2k rows) in message-id order: a lease or ack MERGE then rewrites only
    # the few files whose id range it touches, however large the backlog grows.
    configuration={"delta.targetFileSize": "65536"},
    # Its history is read by nobody: a writer's conflict check needs the commits since its
    # snapshot (seconds; a delta-spark MERGE under a minute here), and the cursors are
    # application transactions, which checkpoints keep. 15 minutes is ample.
    log_keep_seconds=900.0,
    insert_only_prefix="_attempts-",
)

# The deliveries partitions of the delivery history: ``_attempts-<yyyy-mm-dd>``. A sub_uid
# is plain [a-z0-9] (README "Storage layout"), so no subscription's partition starts so.
HISTORY_PREFIX = "_attempts-"

_BACKLOG_LAYERS = (
    # Version 1: round 1's layout.
    (
        pa.field("subscription", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("num_undelivered_messages", pa.int64()),
        pa.field("num_outstanding_messages", pa.int64()),
        pa.field("oldest_unacked_message_age", pa.float64()),
        pa.field("expired_ack_deadlines", pa.int64()),
        # Push subscriptions only (null for pull): totals since the push job first ran,
        # and the job's current push window and backoff.
        pa.field("delivered", pa.int64()),
        pa.field("acked", pa.int64()),
        pa.field("nacked", pa.int64()),
        pa.field("push_window", pa.int64()),
        pa.field("backoff_seconds", pa.float64()),
        pa.field("updated_at", TS),
    ),
    # Version 2. Push only: until when the backoff holds pushes, its main cause ("http 503",
    # "timeout", "connection refused", "expired", ...), the latest outcome and the latest failure.
    (
        pa.field("backoff_until", TS),
        pa.field("backoff_reason", pa.string()),
        pa.field("last_status", pa.string()),
        pa.field("last_error", pa.string()),
    ),
    # Version 3 (issue 13, dead-letter topics; null without a dead-letter policy): the
    # subscription's messages on its dead-letter topic, and the messages past
    # max_delivery_attempts that stay because that topic no longer exists.
    (
        pa.field("dead_lettered", pa.int64()),
        pa.field("dead_letter_blocked", pa.int64()),
    ),
)

BACKLOG = TableSpec("backlog", _BACKLOG_LAYERS)

# Every backlog write is also appended here: the backlog over time, for charts and alerts.
BACKLOG_HISTORY = TableSpec("backlog_history", _BACKLOG_LAYERS)

# Snapshots (issue 15): one row per live snapshot. ``cursor_version``: the source
# subscription's fan-out cursor when it was taken; every message of the topic committed
# after it is part of the snapshot, so vacuum keeps the messages history from there
# (``retention``). ``oldest_publish_time``: of its unacked messages (null: none).
SNAPSHOTS = TableSpec(
    "snapshots",
    (
        (
            pa.field("name", pa.string(), nullable=False),
            pa.field("snapshot_uid", pa.string(), nullable=False),
            pa.field("topic", pa.string()),
            pa.field("topic_uid", pa.string()),
            pa.field("subscription", pa.string()),
            pa.field("cursor_version", pa.int64()),
            pa.field("labels", STR_MAP),
            pa.field("create_time", TS),
            pa.field("expire_time", TS),
            pa.field("oldest_publish_time", TS),
        ),
    ),
)

# The messages unacked in the source subscription when a snapshot was taken: the keys a
# deliveries row holds, one partition per snapshot. Written (appended) before the snapshot's
# registry row and deleted after it, so a registry row always has its messages; a
# partition with no registry row is a crash's leftover, which maintenance deletes.
SNAPSHOT_MESSAGES = TableSpec(
    "snapshot_messages",
    (
        (
            pa.field("snapshot_uid", pa.string(), nullable=False),
            pa.field("message_id", pa.string(), nullable=False),
            pa.field("message_version", pa.int64()),
            pa.field("publish_time", TS),
            pa.field("ordering_key", pa.string()),
            pa.field("size_bytes", pa.int64()),
        ),
    ),
    partition_by=("snapshot_uid",),
)

ALL = (TOPICS, SUBSCRIPTIONS, MESSAGES, DELIVERIES, BACKLOG, BACKLOG_HISTORY, SNAPSHOTS, SNAPSHOT_MESSAGES)
BY_NAME = {t.name: t for t in ALL}
