"""Per-subscription backlog figures, computed from the lease state and the messages table."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, replace
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from .delivery import dead_letter
from .delivery.cursor import pending_range, read_unfanned, read_unfanned_times
from .delivery.hooks import hooks_for
from .registry import SubscriptionRecord
from .storage import Engine
from .storage.tables import BACKLOG, BACKLOG_HISTORY, DELIVERIES
from .timestamps import ts_scalar, utc


@dataclass(frozen=True, slots=True)
class BacklogStats:
    subscription: str
    topic: str
    num_undelivered_messages: int  # published, never delivered
    num_outstanding_messages: int  # delivered, lease still running
    oldest_unacked_message_age: float  # seconds; 0 when nothing is unacked
    expired_ack_deadlines: int  # delivered, deadline passed or nacked: due for redelivery
    updated_at: dt.datetime
    delivered: int | None = None  # push only: pushes sent
    acked: int | None = None
    nacked: int | None = None  # nacks, errors and timeouts
    push_window: int | None = None
    backoff_seconds: float | None = None
    backoff_until: dt.datetime | None = None  # pushes held until then (null when not in backoff)
    backoff_reason: str | None = None  # the backoff's main cause: "http 503", "timeout", "connection refused", ...
    last_status: str | None = None  # the latest push outcome: "http 204", "http 503", "timeout", ...
    last_error: str | None = None  # the latest failure, kept after recovery
    # Dead-letter policy only (issue 13; null without one): the subscription's messages on its
    # dead-letter topic, and those past max_delivery_attempts held because that topic is gone.
    dead_lettered: int | None = None
    dead_letter_blocked: int | None = None

    @property
    def num_unacked_messages(self) -> int:
        return self.num_undelivered_messages + self.num_outstanding_messages + self.expired_ack_deadlines


def _count(mask: pa.ChunkedArray) -> int:
    """True values in a boolean column (nulls count as false)."""
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _from_file_stats(files: pa.Table) -> tuple[int, dt.datetime | None] | None:
    """Row count and oldest publish_time of a partition from the log's file statistics, or
    None when some file lacks them (then the rows are read)."""
    if "num_records" not in files.column_names or "min.publish_time" not in files.column_names:
        return None
    if files.num_rows and (files["num_records"].null_count or files["min.publish_time"].null_count):
        return None
    total = int(pc.sum(files["num_records"]).as_py() or 0)
    oldest = pc.min(files["min.publish_time"]).as_py() if files.num_rows else None
    return total, oldest


def compute(engine: Engine, sub: SubscriptionRecord, now: float) -> BacklogStats:
    """Every deliveries row is an unacked message. The count and the oldest publish time
    come from the log's file statistics; only rows ever delivered (a few files at the head
    of the backlog) are read, for their leases. A 1M backlog no longer means reading 1M rows.
    A detached subscription has no backlog: its figures are zero, whatever rows a crash
    during the detach may have left (``delivery.detach``)."""
    if sub.detached:
        return BacklogStats(sub.name, sub.topic, 0, 0, 0.0, 0, updated_at=utc(now))
    snap = engine.snapshot(DELIVERIES.name)
    columns = ["publish_time", "delivery_attempt", "lease_expires"]
    summary = _from_file_stats(snap.file_stats(partition=sub.sub_uid))
    if summary is None:
        rows = snap.read(columns=columns, partition=sub.sub_uid)
        total = rows.num_rows
        oldest_row = pc.min(rows["publish_time"]).as_py() if rows.num_rows else None
    else:
        total, oldest_row = summary
        rows = snap.read(
            columns=columns, partition=sub.sub_uid,
            filter=pc.field("delivery_attempt") > 0, prune="delivery_attempt > 0",
        )
    cursor, latest = pending_range(engine, snap, sub)
    # Messages not fanned out yet count only if the subscription's filter keeps them: the
    # others will never be delivered (acked at fan-out), as Pub/Sub's backlog leaves them out.
    keep = hooks_for(sub).keep
    if keep is not None:
        unfanned = read_unfanned(engine, sub, cursor + 1, latest, attributes=True)
        unfanned = unfanned.filter(keep(unfanned))
    else:  # only what the figures need: a lagging subscription can leave millions unfanned
        unfanned = read_unfanned_times(engine, sub, cursor + 1, latest)
    now_ts = ts_scalar(now)
    delivered = pc.greater(rows["delivery_attempt"], 0)
    delivered_n = _count(delivered)
    outstanding = _count(pc.and_(delivered, pc.greater(rows["lease_expires"], now_ts)))
    undelivered = total - delivered_n
    mins = [m for m in (oldest_row, pc.min(unfanned["publish_time"]).as_py() if unfanned.num_rows else None) if m is not None]
    oldest = min(mins, default=None)
    age = max(0.0, now - oldest.timestamp()) if oldest is not None else 0.0
    dead_lettered, blocked = dead_letter.backlog_figures(engine, sub, rows["delivery_attempt"], lambda: now)
    return BacklogStats(
        subscription=sub.name,
        topic=sub.topic,
        num_undelivered_messages=int(undelivered + unfanned.num_rows),
        num_outstanding_messages=int(outstanding),
        oldest_unacked_message_age=age,
        expired_ack_deadlines=int(delivered_n - outstanding),
        updated_at=utc(now),
        dead_lettered=dead_lettered,
        dead_letter_blocked=blocked,
    )


PUSH_FIELDS = (
    "delivered", "acked", "nacked", "push_window", "backoff_seconds",
    "backoff_until", "backoff_reason", "last_status", "last_error",
)


def keep_push_fields(engine: Engine, stats: Iterable[BacklogStats]) -> list[BacklogStats]:
    """Stats computed outside the push job, with each push subscription's counters, window and
    backoff carried over from the backlog table (the job restores its window from them)."""
    current = {r["subscription"]: r for r in engine.snapshot(BACKLOG.name).read(columns=["subscription", *PUSH_FIELDS]).to_pylist()}
    out = []
    for s in stats:
        row = current.get(s.subscription)
        if row is not None and s.delivered is None:
            s = replace(s, **{f: row[f] for f in PUSH_FIELDS})
        out.append(s)
    return out


def write(engine: Engine, stats: Iterable[BacklogStats]) -> None:
    """Replace the backlog table with these figures (one row per subscription) and append
    them to backlog_history."""
    table = pa.Table.from_pylist([{f: asdict(s)[f] for f in BACKLOG.schema.names} for s in stats], schema=BACKLOG.schema)
    engine.transact(BACKLOG.name, lambda snap: snap.overwrite(table), what="refresh backlog")
    if table.num_rows:
        engine.append(BACKLOG_HISTORY.name, table)


def refresh(engine: Engine, subscriptions: Iterable[SubscriptionRecord], now: float) -> list[BacklogStats]:
    """Compute the backlog of every given subscription at `now` and rewrite the backlog table
    (and append to backlog_history). Push subscriptions keep the push job's counters, window
    and backoff, which the job restores from. Returns the rows written, by subscription name."""
    stats = [compute(engine, rec, now) for rec in sorted(subscriptions, key=lambda r: r.name)]
    stats = keep_push_fields(engine, stats)
    write(engine, stats)
    return stats
