"""The Delta tables of a warehouse: names, schemas, partitioning, table properties.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
STR_MAP = pa.map_(pa.string(), pa.string())

PUSH_CONFIG = pa.struct(
    [
        pa.field("push_endpoint", pa.string()),
        pa.field("attributes", STR_MAP),
        pa.field(
            "oidc_token",
            pa.struct([pa.field("service_account_email", pa.string()), pa.field("audience", pa.string())]),
        ),
        pa.field("no_wrapper", pa.struct([pa.field("write_metadata", pa.bool_())])),
    ]
)


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    configuration: dict[str, str] = field(default_factory=dict)

    @property
    def partition_column(self) -> str | None:
        return self.partition_by[0] if self.partition_by else None


TOPICS = TableSpec(
    "topics",
    pa.schema(
        [
            pa.field("name", pa.string(), nullable=False),
            pa.field("topic_uid", pa.string(), nullable=False),
            pa.field("labels", STR_MAP),
            pa.field("create_time", TS),
        ]
    ),
)

SUBSCRIPTIONS = TableSpec(
    "subscriptions",
    pa.schema(
        [
            pa.field("name", pa.string(), nullable=False),
            pa.field("sub_uid", pa.string(), nullable=False),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("topic_uid", pa.string(), nullable=False),
            pa.field("push_config", PUSH_CONFIG),
            pa.field("ack_deadline_seconds", pa.int32()),
            pa.field("labels", STR_MAP),
            pa.field("enable_message_ordering", pa.bool_()),
            # messages-table version at creation: the subscription point.
            pa.field("start_version", pa.int64()),
            pa.field("create_time", TS),
            pa.field("update_time", TS),
        ]
    ),
)

MESSAGES = TableSpec(
    "messages",
    pa.schema(
        [
            pa.field("topic_uid", pa.string(), nullable=False),
            pa.field("topic", pa.string()),
            pa.field("message_id", pa.string(), nullable=False),
            pa.field("data", pa.binary()),
            pa.field("attributes", STR_MAP),
            pa.field("ordering_key", pa.string()),
            pa.field("publish_time", TS),
            # data + attribute bytes, so backlog bytes need not read the payloads.
            pa.field("size_bytes", pa.int64()),
        ]
    ),
    partition_by=("topic_uid",),
    configuration={"delta.enableChangeDataFeed": "true"},
)

DELIVERIES = TableSpec(
    "deliveries",
    pa.schema(
        [
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
        ]
    ),
    partition_by=("sub_uid",),
    # Small files (~2k rows) in message-id order: a lease or ack MERGE then rewrites only
    # the few files whose id range it touches, however large the backlog grows.
    configuration={"delta.targetFileSize": "65536"},
)

BACKLOG = TableSpec(
    "backlog",
    pa.schema(
        [
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
            # Added later, so at the end (ensure_tables adds them to older warehouses). Push only:
            # until when the backoff holds pushes, its main cause ("http 503", "timeout",
            # "connection refused", "expired", ...), the latest outcome and the latest failure.
            pa.field("backoff_until", TS),
            pa.field("backoff_reason", pa.string()),
            pa.field("last_status", pa.string()),
            pa.field("last_error", pa.string()),
        ]
    ),
)

# Every backlog write is also appended here: the backlog over time, for charts and alerts.
BACKLOG_HISTORY = TableSpec("backlog_history", BACKLOG.schema)

ALL = (TOPICS, SUBSCRIPTIONS, MESSAGES, DELIVERIES, BACKLOG, BACKLOG_HISTORY)
BY_NAME = {t.name: t for t in ALL}
