"""The snapshot registry (issue 15): named snapshots of subscriptions, and their messages.

Contract. A snapshot is a row of the ``snapshots`` table (name, uid, topic, the source
subscription's fan-out cursor, labels, create and expire times) and a partition of
``snapshot_messages`` holding the keys of the messages that were unacked in the source
subscription when it was taken. What a snapshot captures and what a seek to it does is
``delivery/seek``'s; this module only stores, lists and deletes them.

Two tables, so two commits, ordered so that no crash leaves a registry row without its
messages: creating appends the messages (a blind append in a partition of its own, which
never conflicts) and then inserts the registry row (unique by name); deleting removes the
registry row and then the messages. A crash between either pair leaves a partition with no
registry row, which nobody reads; ``sweep_orphans`` (run by ``deltabus maintenance``)
deletes those older than an hour (younger ones may be a create in progress).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from .errors import AlreadyExists, NotFound
from .registry import new_uid
from .storage import Engine, MatchedDelete, MatchedUpdate, NotMatchedInsert, literal
from .storage.tables import SNAPSHOT_MESSAGES, SNAPSHOTS
from .types import Snapshot

Clock = Callable[[], float]

# A snapshot_messages partition with no registry row is deleted once this old (seconds):
# a younger one may belong to a create between its two commits.
ORPHAN_GRACE_SECONDS = 3600.0

# The key columns of a snapshot's messages (a deliveries row's, without its lease).
MESSAGE_COLUMNS = ("message_id", "message_version", "publish_time", "ordering_key", "size_bytes")


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    name: str
    snapshot_uid: str
    topic: str
    topic_uid: str
    subscription: str  # the source subscription's name (informative: the snapshot outlives it)
    cursor_version: int
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: dt.datetime | None = None
    expire_time: dt.datetime | None = None
    oldest_publish_time: dt.datetime | None = None

    def public(self) -> Snapshot:
        return Snapshot(name=self.name, topic=self.topic, expire_time=self.expire_time, labels=dict(self.labels))


def _row(rec: SnapshotRecord) -> dict[str, Any]:
    return {
        "name": rec.name, "snapshot_uid": rec.snapshot_uid, "topic": rec.topic, "topic_uid": rec.topic_uid,
        "subscription": rec.subscription, "cursor_version": rec.cursor_version, "labels": list(rec.labels.items()),
        "create_time": rec.create_time, "expire_time": rec.expire_time, "oldest_publish_time": rec.oldest_publish_time,
    }


def _from_row(r: Mapping[str, Any]) -> SnapshotRecord:
    return SnapshotRecord(
        r["name"], r["snapshot_uid"], r["topic"], r["topic_uid"], r["subscription"], int(r["cursor_version"]),
        dict(r.get("labels") or []), r.get("create_time"), r.get("expire_time"), r.get("oldest_publish_time"),
    )


class Snapshots:
    """The snapshots of one warehouse. Reads go through a cache keyed by table version."""

    def __init__(self, engine: Engine, *, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock
        self._cache: tuple[int, dict[str, SnapshotRecord]] | None = None

    def all(self) -> dict[str, SnapshotRecord]:
        snap = self._engine.snapshot(SNAPSHOTS.name)
        if self._cache is not None and self._cache[0] == snap.version:
            return self._cache[1]
        parsed = {r["name"]: _from_row(r) for r in snap.read().to_pylist()}
        self._cache = (snap.version, parsed)
        return parsed

    def get(self, name: str) -> SnapshotRecord:
        rec = self.all().get(name)
        if rec is None:
            raise NotFound("snapshot", name)
        return rec

    def messages(self, rec: SnapshotRecord) -> pa.Table:
        """The snapshot's unacked messages (MESSAGE_COLUMNS)."""
        rows = self._engine.snapshot(SNAPSHOT_MESSAGES.name).read(columns=list(MESSAGE_COLUMNS), partition=rec.snapshot_uid)
        return rows.cast(pa.schema([SNAPSHOT_MESSAGES.schema.field(c) for c in MESSAGE_COLUMNS]))

    def messages_of_live(self, rec: SnapshotRecord) -> pa.Table:
        """``messages``, then NotFound unless the snapshot still exists: a delete removes the
        registry row before the messages, so a row still there after the read means the read
        saw all of them (a seek must not take a half-deleted snapshot's empty set for "nothing
        unacked" and ack the whole backlog)."""
        rows = self.messages(rec)
        again = self.all().get(rec.name)
        if again is None or again.snapshot_uid != rec.snapshot_uid:
            raise NotFound("snapshot", rec.name)
        return rows

    def create(self, rec: SnapshotRecord, messages: pa.Table) -> SnapshotRecord:
        """Store a new snapshot: its messages (MESSAGE_COLUMNS), then its registry row.
        AlreadyExists when the name is taken (its messages are deleted again)."""
        if rec.name in self.all():
            raise AlreadyExists("snapshot", rec.name)
        if messages.num_rows:
            rows = messages.select(list(MESSAGE_COLUMNS))
            rows = rows.add_column(0, "snapshot_uid", pa.repeat(pa.scalar(rec.snapshot_uid, pa.string()), rows.num_rows))
            self._engine.append(SNAPSHOT_MESSAGES.name, rows.cast(SNAPSHOT_MESSAGES.schema))
        source = pa.Table.from_pylist([_row(rec)], schema=SNAPSHOTS.schema)

        def fn(snap: Any) -> None:
            if snap.read(columns=["name"], filter=pc.field("name") == rec.name).num_rows:
                raise AlreadyExists("snapshot", rec.name)
            m = snap.merge(source, "t.name = s.name", [NotMatchedInsert({c: f"s.{c}" for c in SNAPSHOTS.schema.names})])
            # delta-spark's MERGE reads the table again: a same-name create that committed
            # after the check above makes it insert nothing (delta-rs merges the snapshot).
            if not m.get("num_target_rows_inserted"):
                raise AlreadyExists("snapshot", rec.name)

        try:
            self._engine.transact(SNAPSHOTS.name, fn, what=f"create snapshot {rec.name}")
        except AlreadyExists:
            self._drop_messages(rec.snapshot_uid)
            raise
        return rec

    def update_labels(self, name: str, labels: Mapping[str, str]) -> SnapshotRecord:
        """Replace a snapshot's labels (validated by the caller). NotFound when it is gone."""
        rec = replace(self.get(name), labels=dict(labels))
        source = pa.Table.from_pylist([_row(rec)], schema=SNAPSHOTS.schema)

        def fn(snap: Any) -> None:
            m = snap.merge(source, "t.name = s.name AND t.snapshot_uid = s.snapshot_uid", [MatchedUpdate({"labels": "s.labels"})])
            if not m.get("num_target_rows_updated"):
                raise NotFound("snapshot", name)

        self._engine.transact(SNAPSHOTS.name, fn, what=f"update snapshot {name}")
        return rec

    def delete(self, name: str) -> SnapshotRecord:
        """Delete a snapshot: its registry row, then its messages. NotFound when it is gone."""
        rec = self.get(name)
        self._delete_row(rec)
        self._drop_messages(rec.snapshot_uid)
        return rec

    def _delete_row(self, rec: SnapshotRecord) -> bool:
        source = pa.table({"name": [rec.name], "snapshot_uid": [rec.snapshot_uid]})

        def fn(snap: Any) -> bool:
            m = snap.merge(source, "t.name = s.name AND t.snapshot_uid = s.snapshot_uid", [MatchedDelete()])
            return bool(m.get("num_target_rows_deleted"))

        if not self._engine.transact(SNAPSHOTS.name, fn, what=f"delete snapshot {rec.name}"):
            raise NotFound("snapshot", rec.name)
        return True

    def _drop_messages(self, snapshot_uid: str) -> None:
        def fn(snap: Any) -> None:
            if snap.read(columns=["message_id"], partition=snapshot_uid).num_rows:
                snap.delete(f"snapshot_uid = {literal(snapshot_uid)}")

        self._engine.transact(SNAPSHOT_MESSAGES.name, fn, what=f"drop the messages of snapshot {snapshot_uid}")

    def delete_expired(self, now: float) -> list[SnapshotRecord]:
        """Delete every snapshot whose expire_time is at or before `now`; return them."""
        gone = []
        for rec in list(self.all().values()):
            if rec.expire_time is not None and rec.expire_time.timestamp() <= now:
                try:
                    self._delete_row(rec)
                except NotFound:  # deleted meanwhile
                    continue
                self._drop_messages(rec.snapshot_uid)
                gone.append(rec)
        return gone

    def sweep_orphans(self, now: float) -> int:
        """Delete the snapshot_messages partitions that no snapshot owns and that are older
        than ORPHAN_GRACE_SECONDS (a crash's leftovers); return how many."""
        live = {r.snapshot_uid for r in self.all().values()}
        stats = self._engine.snapshot(SNAPSHOT_MESSAGES.name).file_stats()
        if stats.num_rows == 0:
            return 0
        # Both engines list files through delta-rs's flattened add actions: the partition value
        # and the file's modification time (ms since the epoch) are columns.
        swept = 0
        by_uid: dict[str, float] = {}
        for uid, mtime in zip(stats["partition.snapshot_uid"].to_pylist(), stats["modification_time"].to_pylist()):
            seconds = _seconds(mtime)
            by_uid[uid] = max(by_uid.get(uid, seconds), seconds)
        for uid, newest in by_uid.items():
            if uid in live or now - newest < ORPHAN_GRACE_SECONDS:
                continue
            self._drop_messages(uid)
            swept += 1
        return swept


def _seconds(mtime: Any) -> float:
    """A file's modification time (an int of ms since the epoch, or a datetime) as seconds."""
    if mtime is None:
        return float("inf")  # unknown: never old enough to sweep
    if isinstance(mtime, dt.datetime):
        return mtime.timestamp()
    return float(mtime) / 1000.0


def new_snapshot_uid() -> str:
    return new_uid("n")
