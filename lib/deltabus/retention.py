"""Message retention (issue 15), how far back vacuum must keep the messages table's history,
and warehouse maintenance with both.

Fan-out reads the messages table's change feed from each subscription's cursor
(``delivery.cursor``), and a seek to a snapshot reads it from the snapshot's cursor
(``delivery.seek``): both need the data files of every version after the oldest such
cursor, so vacuum must not delete them. Storage (``storage.maintenance``) compacts,
checkpoints and vacuums without knowing of subscriptions; this module, above it, reads the
cursors through the ``Engine`` and tells it how many hours to keep.

Retention (``apply_retention``, run first by ``maintain``) deletes expired snapshots,
drops unacked messages older than their subscription's retention, and deletes from the
messages table what no topic retention, subscription retention, snapshot or cursor still
needs (``policy.retention``). Rows it deletes stay readable by the change feed until vacuum
removes their files, which the cursors' hours above prevent while anyone may read them.
"""

from __future__ import annotations

import functools
import logging
import math
from datetime import datetime, timezone
from typing import Any, Callable

from .delivery.cursor import cursor_app_id
from .delivery.history import day_of_partition, is_history_partition
from .errors import InvalidArgument
from .delivery.retained import drop_expired
from .policy.retention import message_cutoff
from .registry import Registry, SubscriptionRecord
from .snapshots import Snapshots
from .storage import literal
from .timestamps import timestamp_sql
from .storage import Engine
from .storage.maintenance import DEFAULT_RETENTION_HOURS, first_commit_since, maintain_warehouse
from .storage.tables import DELIVERIES, MESSAGES, SNAPSHOTS, SUBSCRIPTIONS

log = logging.getLogger(__name__)


def needed_after(engine: Engine) -> dict[str, list[int]]:
    """By topic uid, the messages versions whose successors someone still reads from the
    change feed: each subscription's fan-out cursor and each snapshot's cursor (a seek to it
    reads every version after it)."""
    subs = engine.snapshot(SUBSCRIPTIONS.name).read(columns=["sub_uid", "topic_uid", "start_version"]).to_pylist()
    deliveries = engine.snapshot(DELIVERIES.name)
    out: dict[str, list[int]] = {}
    for row in subs:
        cursor = deliveries.txn_version(cursor_app_id(row["sub_uid"]))
        out.setdefault(row["topic_uid"], []).append(row["start_version"] if cursor is None else cursor)
    for snap in engine.snapshot(SNAPSHOTS.name).read(columns=["topic_uid", "cursor_version"]).to_pylist():
        out.setdefault(snap["topic_uid"], []).append(int(snap["cursor_version"]))
    return out


def oldest_unfanned_version(engine: Engine) -> int | None:
    """The first messages version some subscription has not fanned out yet (its cursor + 1),
    or some snapshot still needs, the lowest over all of them; None when there are none."""
    cursors = [c for per_topic in needed_after(engine).values() for c in per_topic]
    return min(cursors) + 1 if cursors else None


def hours_to_keep(first_unfanned_commit: float | None, now: float) -> int:
    """Whole hours of history to keep so that a commit made at `first_unfanned_commit`
    (seconds since the epoch) survives vacuum at `now`: its age rounded up, plus one hour
    of margin for the time between this reading and the vacuum. 0 when nothing is unfanned."""
    if first_unfanned_commit is None:
        return 0
    age_hours = max(0.0, now - first_unfanned_commit) / 3600.0
    return int(math.ceil(age_hours)) + 1


def hours_to_keep_for_fan_out(engine: Engine, now: float) -> int:
    """Hours of messages history that subscriptions still have to fan out (0: none)."""
    oldest = oldest_unfanned_version(engine)
    if oldest is None:
        return 0
    return hours_to_keep(first_commit_since(engine.table_uri(MESSAGES.name), oldest), now)


DEFAULT_HISTORY_RETENTION_DAYS = 7


def history_cutoff_day(now: float, days: int) -> str:
    """yyyy-mm-dd of the oldest history day kept `days` days after `now`: the days before it go."""
    if isinstance(days, bool) or not isinstance(days, int) or days < 0:
        raise InvalidArgument("history_retention_days", f"must be a whole number of days >= 0, got {days!r}")
    return datetime.fromtimestamp(now - days * 86_400.0, tz=timezone.utc).strftime("%Y-%m-%d")


def drop_old_history(engine: Engine, now: float, days: int = DEFAULT_HISTORY_RETENTION_DAYS) -> int:
    """Delete the delivery history's day partitions (``_attempts-<yyyy-mm-dd>``) older than
    `days` days; return how many. Each is one delete of a whole partition (its files are
    removed, nothing is rewritten), listed from the log's statistics, no read. Only ever
    inserted into, so deleting one conflicts with no delivery write."""
    cutoff = history_cutoff_day(now, days)
    stats = engine.snapshot(DELIVERIES.name).file_stats()
    column = f"partition.{DELIVERIES.partition_column}"
    if stats.num_rows == 0 or column not in stats.column_names:
        return 0
    old = sorted({u for u in stats[column].to_pylist() if is_history_partition(u) and day_of_partition(u) < cutoff})
    for part in old:
        predicate = f"sub_uid = {literal(part)}"
        engine.transact(DELIVERIES.name, functools.partial(_delete_where, predicate), what=f"drop the delivery history of {day_of_partition(part)}")
    return len(old)


def apply_retention(
    engine: Engine, *, clock: Callable[[], float], history_retention_days: int = DEFAULT_HISTORY_RETENTION_DAYS
) -> dict[str, int]:
    """Carry out message retention (issue 15), in an order where each step only removes what
    the later ones no longer need:

    0. deliveries partitions of subscriptions that no longer exist are deleted (a crash
       between deleting a subscription's row and its messages leaves one);
    1. expired snapshots are deleted, and snapshot messages no snapshot owns (a crash's);
    2. each subscription's unacked messages older than its retention are dropped
       (``delivery.retained.drop_expired``);
    3. each topic's messages older than every rule keeps (``policy.retention``) leave the
       messages table, one delete per topic partition.

    4. the delivery history's days older than `history_retention_days` are deleted.

    Returns counts: deliveries_orphans, snapshots_expired, snapshot_orphans, unacked_dropped,
    topics_trimmed, history_days_dropped."""
    history_cutoff_day(0.0, history_retention_days)  # refuse a bad value before anything is deleted
    now = clock()
    registry = Registry(engine, clock=clock)
    snapshots = Snapshots(engine, clock=clock)
    report = {"deliveries_orphans": sweep_deliveries(engine, registry)}
    report |= {"snapshots_expired": len(snapshots.delete_expired(now)), "snapshot_orphans": snapshots.sweep_orphans(now)}
    subs = list(registry.subscriptions().values())
    report["unacked_dropped"] = sum(drop_expired(engine, s, clock=clock) for s in subs if not s.detached)
    report["topics_trimmed"] = _trim_messages(engine, registry, subs, snapshots, now)
    report["history_days_dropped"] = drop_old_history(engine, now, history_retention_days)
    return report


def _delete_where(predicate: str, snap: Any) -> None:
    snap.delete(predicate)


def sweep_deliveries(engine: Engine, registry: Registry) -> int:
    """Delete the deliveries partitions whose subscription no longer exists; return how many.

    The partitions are listed (from the log) before the registry is read: a subscription
    gets rows only after its registry row committed, so one whose rows are listed is in the
    registry read after, unless it was deleted. A pull that read the registry before a
    deletion may still write rows after this; the next run sweeps them."""
    stats = engine.snapshot(DELIVERIES.name).file_stats()
    column = f"partition.{DELIVERIES.partition_column}"
    if stats.num_rows == 0 or column not in stats.column_names:
        return 0
    # The delivery history's day partitions belong to no subscription (``drop_old_history``).
    listed = {u for u in stats[column].to_pylist() if not is_history_partition(u)}
    live = {s.sub_uid for s in registry.subscriptions().values()}
    swept = 0
    for uid in sorted(u for u in listed - live if u is not None):
        predicate = f"sub_uid = {literal(uid)}"
        engine.transact(DELIVERIES.name, functools.partial(_delete_where, predicate), what=f"drop the rows of deleted subscription {uid}")
        swept += 1
    return swept


def _oldest_held(engine: Engine, subs: list[SubscriptionRecord]) -> dict[str, list[float]]:
    """By topic uid, the oldest publish time of each subscription's deliveries rows, from the
    log's file statistics (no read): every row still there keeps its payload, including rows
    a dead-letter move owns (``drop_expired`` leaves those to the move) and rows a seek that
    committed after the retention step brought back."""
    stats = engine.snapshot(DELIVERIES.name).file_stats()
    column = f"partition.{DELIVERIES.partition_column}"
    if stats.num_rows == 0 or column not in stats.column_names or "min.publish_time" not in stats.column_names:
        return {}
    topic_of = {s.sub_uid: s.topic_uid for s in subs}
    out: dict[str, list[float]] = {}
    for sub_uid, low in zip(stats[column].to_pylist(), stats["min.publish_time"].to_pylist()):
        if low is not None and sub_uid in topic_of:
            out.setdefault(topic_of[sub_uid], []).append(low.timestamp())
    return out


def _trim_messages(engine: Engine, registry: Registry, subs: list[SubscriptionRecord], snapshots: Snapshots, now: float) -> int:
    """Delete what no rule keeps from each topic partition of the messages table; return how
    many partitions lost rows."""
    messages = engine.snapshot(MESSAGES.name)
    stats = messages.file_stats()
    if stats.num_rows == 0:
        return 0
    column = f"partition.{MESSAGES.partition_column}"
    oldest: dict[str, Any] = {}
    for uid, low in zip(stats[column].to_pylist(), stats["min.publish_time"].to_pylist() if "min.publish_time" in stats.column_names else [None] * stats.num_rows):
        prev = oldest.get(uid, low)
        oldest[uid] = low if prev is None or (low is not None and low < prev) else prev
    topics = {t.topic_uid: t for t in registry.topics().values()}
    cursors = needed_after(engine)
    held = _oldest_held(engine, subs)
    uri = engine.table_uri(MESSAGES.name)
    trimmed = 0
    for uid, low in oldest.items():
        kept_since = [
            s.oldest_publish_time.timestamp() for s in snapshots.all().values()
            if s.topic_uid == uid and s.oldest_publish_time is not None
        ] + held.get(uid, [])
        if cursors.get(uid):
            first = first_commit_since(uri, min(cursors[uid]) + 1)
            if first is not None:
                kept_since.append(first)
        topic = topics.get(uid)
        cutoff = message_cutoff(
            now,
            topic_retention=topic.message_retention_duration if topic is not None else None,
            subscription_retentions=[s.message_retention_duration for s in subs if s.topic_uid == uid and not s.detached],
            kept_since=kept_since,
        )
        if low is None or low.timestamp() >= cutoff:
            continue  # nothing old enough in this partition (by the log's statistics: no read)
        predicate = f"{MESSAGES.partition_column} = {literal(uid)} AND publish_time < {timestamp_sql(cutoff)}"
        engine.transact(MESSAGES.name, lambda snap: snap.delete(predicate), what=f"trim the messages of topic {uid}")
        trimmed += 1
    return trimmed


def maintain(
    engine: Engine,
    *,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    min_files: int = 2,
    clock: Callable[[], float],
    retain: bool = True,
    history_retention_days: int = DEFAULT_HISTORY_RETENTION_DAYS,
) -> list[dict[str, Any]]:
    """``storage.maintenance.maintain_warehouse`` of the engine's warehouse, keeping the
    messages history every subscription's fan-out still needs.

    The cursors are read before compacting: a cursor only moves forward, so a limit read
    earlier keeps at least as much as one read just before the vacuum would."""
    if retain:  # False: the caller ran apply_retention itself (to report it)
        log.info("retention: %s", apply_retention(engine, clock=clock, history_retention_days=history_retention_days))
    keep = {MESSAGES.name: hours_to_keep_for_fan_out(engine, clock())}
    return maintain_warehouse(engine.warehouse, retention_hours=retention_hours, min_files=min_files, keep_hours=keep)
