"""Seek and snapshots (issue 15): replacing a subscription's set of unacked messages.

Contract. A seek is ONE commit on the subscription's deliveries partition, inside
``engine.transact`` (a concurrent pull, ack or push batch on it conflicts, and the seek
reruns on a fresh snapshot). It first fans out everything up to the messages table's
latest version (the cursor moves there in the same commit), so that every message that
exists when the seek runs is decided by the seek and none by a later fan-out. Then each
row of the partition is dropped (``Op.SEEK_DROP``: it counts as acked), kept
(``Op.SEEK_KEEP``: unacked, due at once, earlier ack ids stale) or inserted (``Op.INSERT``:
a message that comes back). Rows marked for a dead-letter move are left to that move.

- ``seek_to_time(T)``: unacked afterwards are the messages published at or after T that
  are unacked now, not fanned out yet, or retained: with topic retention, every message of
  the topic published within it (even before the subscription existed); with
  ``retain_acked_messages``, every message published within the subscription's retention
  since it was created. Everything published before T counts as acked.
- A snapshot (``capture``) stores the unacked rows and the cursor of one commit's snapshot
  of the partition. ``seek_to_snapshot`` makes unacked exactly those rows and every message
  of the topic committed after that cursor (read from the messages table's change feed:
  ``retention`` keeps that history for every live snapshot).

Every message passes the subscription's filter first. Every message the subscription may
have had before (up to its cursor) gets the seek's epoch as its ``message_version``
(``seek_epoch``: negative, new): its ack ids then differ from every earlier delivery's,
although a message brought back as a new row starts its attempts again at 1, and those
messages come first, in message-id (publish-time) order, before every message fanned out
later: ordering keys see them in publish order.

Cost: a seek reads the partition's keys and, for a seek back in time with retention, the
topic's messages published since T (keys only, unless the subscription has a filter), and
writes one MERGE whose source has a row per message decided. See README "Retention, seek and snapshots" for figures.
"""

from __future__ import annotations

import datetime as dt
from typing import Callable, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FailedPrecondition, InvalidArgument, SubscriptionDetached
from ..registry import SubscriptionRecord, TopicRecord
from ..snapshots import MESSAGE_COLUMNS, SnapshotRecord, Snapshots, new_snapshot_uid
from ..storage import Engine, Snapshot
from ..storage.engine import read_by_ids
from ..storage.tables import DELIVERIES, MESSAGES
from ..timestamps import TS, to_us, utc
from ..types import SNAPSHOT_LIFETIME
from .cursor import DETACHED_CURSOR, FANOUT_COLUMNS, cursor_app_id, read_cursor, read_unfanned
from .hooks import FanoutFilter, hooks_for
from .merge import SEEK_STALE_US, commit, source_rows
from .model import Op

# A snapshot that would expire within this long of its creation is refused (Pub/Sub's rule).
MIN_SNAPSHOT_LIFE = 3600.0

_KEYS = list(FANOUT_COLUMNS)  # message_id, publish_time, ordering_key, size_bytes, message_version
_KEY_SCHEMA = pa.schema([DELIVERIES.schema.field(c) for c in _KEYS])


class SeekResult(NamedTuple):
    unacked: int  # messages unacked in the subscription after the seek
    dropped: int  # rows the seek took out (now acked)
    replayed: int  # messages that came back (inserted)
    cursor: int  # the fan-out cursor after the seek


def _keys(table: pa.Table) -> pa.Table:
    return table.select(_KEYS).cast(_KEY_SCHEMA)


def _ts(seconds: float) -> pa.TimestampScalar:
    return pa.scalar(to_us(seconds), TS)


def _filtered(rows: pa.Table, keep: FanoutFilter | None) -> pa.Table:
    """Rows the subscription's filter keeps (rows carry ``attributes`` when there is a filter)."""
    return rows if keep is None else rows.filter(keep(rows))


def replay_horizon(sub: SubscriptionRecord, topic: TopicRecord | None, now: float) -> float | None:
    """The earliest publish time (seconds) from which acked messages may come back by a seek to
    a time, or None when none may (no topic retention and no retain_acked_messages). Pure."""
    horizons = []
    if topic is not None and topic.topic_uid == sub.topic_uid and topic.message_retention_duration:
        horizons.append(now - topic.message_retention_duration)
    if sub.retain_acked_messages:
        created = sub.create_time.timestamp() if sub.create_time is not None else now
        horizons.append(max(now - sub.message_retention_duration, created))
    return min(horizons) if horizons else None


def _plan(sub: SubscriptionRecord, current: pa.Table, marked: pa.Array, wanted: pa.Table) -> tuple[list[pa.Table], int, int]:
    """Source parts turning the partition's unmarked rows `current` into the set `wanted`
    (keys): (parts, dropped, replayed). A message whose row is `marked` (a dead-letter move
    owns it) is neither kept nor inserted: the move acks it."""
    uid = sub.sub_uid
    in_wanted = pc.is_in(current["message_id"], value_set=wanted["message_id"])
    drop = current.filter(pc.invert(in_wanted))
    wanted = wanted.filter(pc.invert(pc.is_in(wanted["message_id"], value_set=marked)))
    present = pc.is_in(wanted["message_id"], value_set=current["message_id"])
    keep = wanted.filter(present)
    new = wanted.filter(pc.invert(present))
    stale = pa.repeat(pa.scalar(SEEK_STALE_US, TS), keep.num_rows)
    parts = [
        source_rows(Op.SEEK_DROP, uid, drop, drop["delivery_attempt"], pa.nulls(drop.num_rows, TS)),
        source_rows(Op.SEEK_KEEP, uid, keep, pa.nulls(keep.num_rows, pa.int32()), stale),
        source_rows(Op.INSERT, uid, new, pa.repeat(pa.scalar(0, pa.int32()), new.num_rows), pa.nulls(new.num_rows, TS)),
    ]
    return parts, drop.num_rows, new.num_rows


def _partition(snap: Snapshot, uid: str) -> tuple[pa.Table, pa.Array]:
    """The partition's rows not marked for a dead-letter move (keys + delivery_attempt), and
    the message ids of the marked ones."""
    rows = snap.read(columns=[*_KEYS, "delivery_attempt", "dead_letter_key"], partition=uid)
    free = pc.is_null(rows["dead_letter_key"])
    marked = rows.filter(pc.invert(free))["message_id"].combine_chunks().cast(pa.string())
    rows = rows.filter(free)
    return _keys(rows).append_column("delivery_attempt", rows["delivery_attempt"].cast(pa.int32())), marked


def _current(snap: Snapshot, uid: str) -> pa.Table:
    """The partition's rows not marked for a dead-letter move (keys + delivery_attempt)."""
    return _partition(snap, uid)[0]


Decide = Callable[[Snapshot, Snapshot, int, int], pa.Table]


def seek_epoch(now_us: int, current: pa.Table) -> int:
    """The message_version a seek gives every message it keeps or brings back that the
    subscription may have had before (version up to its cursor): negative, so no fan-out
    version (>= 0) and no earlier seek's epoch (an earlier time) equals it, and below every
    version the partition holds. An ack id names (attempt, version), so no ack id of a
    delivery made before the seek names one made after (``ackid``). Pure."""
    epoch = -now_us
    if current.num_rows:
        low = pc.min(current["message_version"]).as_py()
        if low is not None and low <= epoch:
            epoch = low - 1
    return epoch


def _commit(engine: Engine, sub: SubscriptionRecord, decide: Decide, what: str, clock: Callable[[], float]) -> SeekResult:
    """Run one seek: `decide(deliveries snapshot, messages snapshot, cursor, latest)` gives
    the keys of every message unacked afterwards; `latest` is the messages snapshot's version.
    Those up to the cursor get the seek's epoch as their version (``seek_epoch``), so they
    come first, in message-id (publish-time) order; later ones keep their fan-out version."""
    uid = sub.sub_uid

    def fn(snap: Snapshot) -> SeekResult:
        cursor = read_cursor(snap, sub)
        if cursor >= DETACHED_CURSOR:  # detached after `sub` was read: its partition stays empty
            raise SubscriptionDetached(sub.name)
        messages = engine.snapshot(MESSAGES.name)
        latest = max(cursor, messages.version)
        current, marked = _partition(snap, uid)
        wanted = decide(snap, messages, cursor, latest)
        epoch = seek_epoch(to_us(clock()), current)
        seen = pc.less_equal(wanted["message_version"], cursor)
        wanted = wanted.set_column(
            _KEYS.index("message_version"), "message_version",
            pc.if_else(seen, pa.scalar(epoch, pa.int64()), wanted["message_version"]),
        )
        wanted = wanted.take(pc.sort_indices(wanted, [("message_version", "ascending"), ("message_id", "ascending")]))
        parts, dropped, replayed = _plan(sub, current, marked, wanted)
        txns = [(cursor_app_id(uid), latest)] if latest > cursor else []
        # Every row was decided on this snapshot, so every one must apply: on delta-spark a
        # commit landing before the MERGE's own read (or a skipped idempotent write) reruns it.
        commit(snap, parts, [uid], txns, exact=frozenset({Op.SEEK_DROP, Op.SEEK_KEEP, Op.INSERT}))
        return SeekResult(wanted.num_rows, dropped, replayed, latest)

    return engine.transact(DELIVERIES.name, fn, what=what)


def _union(first: pa.Table, second: pa.Table) -> pa.Table:
    """Rows of `first`, then those of `second` whose message_id `first` lacks."""
    second = second.filter(pc.invert(pc.is_in(second["message_id"], value_set=first["message_id"])))
    return pa.concat_tables([_keys(first), _keys(second)])


def seek_to_time(
    engine: Engine, sub: SubscriptionRecord, when: float, *, topic: TopicRecord | None, clock: Callable[[], float]
) -> SeekResult:
    """Seek `sub` to `when` (seconds since the epoch): see the module docstring. `topic` is
    its topic's record while the topic lives (its retention), else None."""
    policy = hooks_for(sub)  # refuses a detached subscription
    keep = policy.keep
    at = _ts(when)

    def decide(snap: Snapshot, messages: Snapshot, cursor: int, latest: int) -> pa.Table:
        now = clock()
        fresh = read_unfanned(engine, sub, cursor + 1, latest, attributes=keep is not None)
        fresh = _filtered(fresh.filter(pc.greater_equal(fresh["publish_time"], at)), keep)
        held = _current(snap, sub.sub_uid)
        held = held.filter(pc.greater_equal(held["publish_time"], at))
        older = held
        horizon = replay_horizon(sub, topic, now)
        if horizon is not None:
            since = _ts(max(when, horizon))
            cols = ["message_id", "publish_time", "ordering_key", "size_bytes"] + (["attributes"] if keep is not None else [])
            retained = messages.read(
                columns=cols, partition=sub.topic_uid, filter=pc.field("publish_time") >= since
            )
            retained = _filtered(retained, keep)
            retained = retained.append_column("message_version", pa.repeat(pa.scalar(cursor, pa.int64()), retained.num_rows))
            older = _union(held, retained)
        # Messages up to the cursor: at the cursor's version here, the seek's epoch once decided.
        older = _keys(older).set_column(
            _KEYS.index("message_version"), "message_version", pa.repeat(pa.scalar(cursor, pa.int64()), older.num_rows)
        )
        return _union(_keys(fresh), older)

    return _commit(engine, sub, decide, f"seek {sub.name} to {utc(when).isoformat()}", clock)


class Capture(NamedTuple):
    cursor: int  # the subscription's fan-out cursor
    rows: pa.Table  # its unacked rows (MESSAGE_COLUMNS)
    oldest: dt.datetime | None  # the oldest publish time of those rows and of the messages after the cursor


def capture(engine: Engine, sub: SubscriptionRecord) -> Capture:
    """What a snapshot of `sub` holds, read from one snapshot of its partition: its cursor and
    unacked rows. Messages after the cursor are part of a snapshot by its cursor (their
    publish times count for ``oldest``); rows marked for a dead-letter move are not (that
    move acks them)."""
    snap = engine.snapshot(DELIVERIES.name)
    rows = _current(snap, sub.sub_uid)
    cursor = read_cursor(snap, sub)
    if cursor >= DETACHED_CURSOR:
        raise SubscriptionDetached(sub.name)
    unfanned = read_unfanned(engine, sub, cursor + 1, engine.version(MESSAGES.name))
    times = [t for t in (pc.min(rows["publish_time"]).as_py(), pc.min(unfanned["publish_time"]).as_py()) if t is not None]
    return Capture(cursor, rows.select(list(MESSAGE_COLUMNS)), min(times) if times else None)


def create_snapshot(
    engine: Engine,
    snapshots: Snapshots,
    name: str,
    sub: SubscriptionRecord,
    labels: dict[str, str],
    *,
    clock: Callable[[], float],
) -> SnapshotRecord:
    """Capture `sub` as snapshot `name` (validated by the caller). It expires
    SNAPSHOT_LIFETIME after its oldest unacked message was published (at most that long
    after now); FailedPrecondition when that is within MIN_SNAPSHOT_LIFE, as Pub/Sub."""
    hooks_for(sub)  # refuses a detached subscription
    cursor, rows, oldest = capture(engine, sub)
    now = clock()
    oldest_s = oldest.timestamp() if oldest is not None else None
    expire = now + SNAPSHOT_LIFETIME if oldest_s is None else min(now, oldest_s) + SNAPSHOT_LIFETIME
    if expire - now < MIN_SNAPSHOT_LIFE:
        raise FailedPrecondition(
            f"snapshot {name}: the oldest unacked message of {sub.name} is so old that the snapshot would expire "
            f"in {max(0.0, expire - now) / 60:.0f} minutes (it must live at least an hour); ack or seek past it first"
        )
    rec = SnapshotRecord(
        name=name, snapshot_uid=new_snapshot_uid(), topic=sub.topic, topic_uid=sub.topic_uid, subscription=sub.name,
        cursor_version=cursor, labels=dict(labels), create_time=utc(now), expire_time=utc(expire),
        oldest_publish_time=oldest,
    )
    return snapshots.create(rec, rows)


def seek_to_snapshot(
    engine: Engine, sub: SubscriptionRecord, rec: SnapshotRecord, messages: pa.Table, *, clock: Callable[[], float]
) -> SeekResult:
    """Seek `sub` to snapshot `rec` whose unacked messages are `messages` (MESSAGE_COLUMNS):
    see the module docstring. InvalidArgument when the snapshot is of another topic."""
    if rec.topic_uid != sub.topic_uid:
        raise InvalidArgument(
            "snapshot", f"{rec.name} is a snapshot of topic {rec.topic}, but {sub.name} is a subscription of {sub.topic}"
        )
    policy = hooks_for(sub)
    keep = policy.keep
    if keep is not None and messages.num_rows:  # the filter reads attributes: fetch them by id
        attrs = read_by_ids(engine.snapshot(MESSAGES.name), messages["message_id"], ["message_id", "attributes"], partition=sub.topic_uid)
        kept = _filtered(attrs, keep)["message_id"]
        messages = messages.filter(pc.is_in(messages["message_id"], value_set=kept.combine_chunks().cast(pa.string())))

    def decide(snap: Snapshot, _messages: Snapshot, cursor: int, latest: int) -> pa.Table:
        after = read_unfanned(engine, sub, rec.cursor_version + 1, latest, attributes=keep is not None)
        return _union(_keys(_filtered(after, keep)), _keys(messages))

    return _commit(engine, sub, decide, f"seek {sub.name} to snapshot {rec.name}", clock)


__all__ = [
    "SeekResult",
    "replay_horizon",
    "seek_epoch",
    "seek_to_time",
    "Capture",
    "capture",
    "create_snapshot",
    "seek_to_snapshot",
]
