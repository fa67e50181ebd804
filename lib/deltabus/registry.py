"""Topic and subscription registries: small Delta tables, read through a version cache."""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from .errors import AlreadyExists, NotFound
from .storage import Engine, MatchedDelete, MatchedUpdate, NotMatchedInsert, literal
from .storage.tables import SUBSCRIPTIONS, TOPICS
from . import subscription_fields
from .names import DELETED_TOPIC
from .policy.expiration import expired
from .timestamps import utc
from .types import Subscription, Topic

Clock = Callable[[], float]
log = logging.getLogger(__name__)


def new_uid(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: dt.datetime | None = None
    message_retention_duration: float | None = None  # seconds; None: no topic retention

    def public(self) -> Topic:
        return Topic(name=self.name, labels=dict(self.labels), message_retention_duration=self.message_retention_duration)


def _topic_row(rec: TopicRecord) -> dict[str, Any]:
    return {
        "name": rec.name, "topic_uid": rec.topic_uid, "labels": list(rec.labels.items()), "create_time": rec.create_time,
        "message_retention_duration": rec.message_retention_duration,
    }


def _topic_from_row(r: Mapping[str, Any]) -> TopicRecord:
    return TopicRecord(r["name"], r["topic_uid"], dict(r.get("labels") or []), r.get("create_time"), r.get("message_retention_duration"))


@dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionRecord(Subscription):
    """A subscription as the registry stores it: its public settings (the fields of
    ``types.Subscription``, so a field declared once is here too) plus the internal columns.

    ``topic`` is the topic it was created on, even once that topic is deleted; ``public()``
    then shows ``_deleted-topic_``. Which columns exist and how they are stored comes from
    ``subscription_fields.COLUMNS``."""

    sub_uid: str
    topic_uid: str
    # messages-table version at creation: the subscription point.
    start_version: int
    create_time: dt.datetime | None = None
    update_time: dt.datetime | None = None
    last_active: dt.datetime | None = None  # see subscription_fields

    def public(self, topic_live: bool = True) -> Subscription:
        values = subscription_fields.public_values(self)
        if not topic_live:
            values["topic"] = DELETED_TOPIC
        return Subscription(**values)


def _sub_row(r: SubscriptionRecord) -> dict[str, Any]:
    return subscription_fields.store({c.name: getattr(r, c.name) for c in subscription_fields.COLUMNS})


def _sub_from_row(row: Mapping[str, Any]) -> SubscriptionRecord:
    return SubscriptionRecord(**subscription_fields.load(row))


def _all_columns(schema: pa.Schema) -> dict[str, str]:
    return {name: f"s.{name}" for name in schema.names}


class Registry:
    def __init__(self, engine: Engine, *, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock
        self._cache: dict[str, tuple[int, dict[str, Any]]] = {}

    # -- reads -------------------------------------------------------------
    def _load(self, table: str, parse: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any]:
        snap = self._engine.snapshot(table)
        cached = self._cache.get(table)
        if cached is not None and cached[0] == snap.version:
            return cached[1]
        rows = snap.read().to_pylist()
        parsed = {r["name"]: parse(r) for r in rows}
        self._cache[table] = (snap.version, parsed)
        return parsed

    def topics(self) -> dict[str, TopicRecord]:
        return self._load(TOPICS.name, _topic_from_row)

    def subscriptions(self) -> dict[str, SubscriptionRecord]:
        return self._load(SUBSCRIPTIONS.name, _sub_from_row)

    def topic(self, name: str) -> TopicRecord:
        rec = self.topics().get(name)
        if rec is None:
            raise NotFound("topic", name)
        return rec

    def subscription(self, name: str) -> SubscriptionRecord:
        rec = self.subscriptions().get(name)
        if rec is None:
            raise NotFound("subscription", name)
        return rec

    def topic_is_live(self, topic_uid: str) -> bool:
        return any(t.topic_uid == topic_uid for t in self.topics().values())

    # -- writes ------------------------------------------------------------
    def _insert_unique(self, table: str, schema: pa.Schema, kind: str, row: dict[str, Any]) -> None:
        source = pa.Table.from_pylist([row], schema=schema)

        def fn(snap: Any) -> None:
            hit = snap.read(columns=["name"], filter=pc.field("name") == row["name"])
            if hit.num_rows:
                raise AlreadyExists(kind, row["name"])
            m = snap.merge(source, "t.name = s.name", [NotMatchedInsert(_all_columns(schema))])
            # delta-spark's MERGE reads the table again: a same-name create that committed
            # after the check above makes it insert nothing (delta-rs merges the snapshot).
            if not m.get("num_target_rows_inserted"):
                raise AlreadyExists(kind, row["name"])

        self._engine.transact(table, fn, what=f"create {kind} {row['name']}")

    def _delete_named(self, table: str, kind: str, name: str, uid_col: str, uid: str) -> None:
        source = pa.table({"name": [name], uid_col: [uid]})

        def fn(snap: Any) -> None:
            m = snap.merge(source, f"t.name = s.name AND t.{uid_col} = s.{uid_col}", [MatchedDelete()])
            if not m.get("num_target_rows_deleted"):
                raise NotFound(kind, name)

        self._engine.transact(table, fn, what=f"delete {kind} {name}")

    def create_topic(self, name: str, labels: Mapping[str, str], retention: float | None = None) -> TopicRecord:
        """Register a topic (labels and retention validated by the caller)."""
        rec = TopicRecord(name, new_uid("t"), dict(labels), utc(self._clock()), retention)
        self._insert_unique(TOPICS.name, TOPICS.schema, "topic", _topic_row(rec))
        return rec

    def update_topic(self, name: str, changes: Mapping[str, Any]) -> TopicRecord:
        """Change a live topic's ``labels`` and/or ``message_retention_duration`` (the keys of
        `changes`, validated by the caller); its uid and messages stay. NotFound when it is gone."""
        unknown = set(changes) - {"labels", "message_retention_duration"}
        if unknown:
            raise ValueError(f"update_topic: cannot change {sorted(unknown)}")
        values: dict[str, Any] = {k: dict(v) if k == "labels" else v for k, v in changes.items()}
        rec = replace(self.topic(name), **values)
        source = pa.Table.from_pylist([_topic_row(rec)], schema=TOPICS.schema)
        sets = {k: f"s.{k}" for k in changes}

        def fn(snap: Any) -> None:
            m = snap.merge(source, "t.name = s.name AND t.topic_uid = s.topic_uid", [MatchedUpdate(sets)])
            if not m.get("num_target_rows_updated"):
                raise NotFound("topic", name)

        if sets:
            self._engine.transact(TOPICS.name, fn, what=f"update topic {name}")
        return rec

    def delete_topic(self, name: str) -> None:
        rec = self.topic(name)
        self._delete_named(TOPICS.name, "topic", name, "topic_uid", rec.topic_uid)

    def create_subscription(self, settings: Subscription, topic: TopicRecord) -> SubscriptionRecord:
        """Register a subscription with validated ``settings`` on ``topic`` (settings.topic
        names it). Raises AlreadyExists when the name is taken."""
        if settings.topic != topic.name:
            raise ValueError(f"settings name topic {settings.topic!r}, but the record is of {topic.name!r}")
        # The subscription point: every message committed after this version is delivered.
        # Read before the subscription commits, so a publish that starts after
        # create_subscription returns always lands at a later version.
        start_version = self._engine.version("messages")
        now = utc(self._clock())
        rec = SubscriptionRecord(
            **subscription_fields.public_values(settings),
            sub_uid=new_uid("s"),
            topic_uid=topic.topic_uid,
            start_version=start_version,
            create_time=now,
            update_time=now,
            # Set at creation, so a null last_active means a row from before expiration
            # policies (schema v4): delete_expired starts its clock instead of judging it.
            last_active=now,
        )
        self._insert_unique(SUBSCRIPTIONS.name, SUBSCRIPTIONS.schema, "subscription", _sub_row(rec))
        return rec

    def replace_subscription(self, rec: SubscriptionRecord) -> SubscriptionRecord:
        """Write new settings for a live subscription (same sub_uid: its messages stay)."""
        rec = replace(rec, update_time=utc(self._clock()))
        source = pa.Table.from_pylist([_sub_row(rec)], schema=SUBSCRIPTIONS.schema)
        # detached is only ever set by detach_subscription: an update made from a record read
        # before a detach must not attach the subscription again.
        fixed = ("name", "sub_uid", "create_time", "start_version", "detached", "last_active")
        settable = {c: f"s.{c}" for c in SUBSCRIPTIONS.schema.names if c not in fixed}

        def fn(snap: Any) -> None:
            m = snap.merge(source, "t.name = s.name AND t.sub_uid = s.sub_uid", [MatchedUpdate(settable)])
            if not m.get("num_target_rows_updated"):
                raise NotFound("subscription", rec.name)

        self._engine.transact(SUBSCRIPTIONS.name, fn, what=f"update subscription {rec.name}")
        return rec

    def detach_subscription(self, name: str) -> SubscriptionRecord:
        """Mark a live subscription detached (one commit on the subscriptions table) and
        return its record as detached. Detaching one already detached commits nothing.
        Raises NotFound when it is gone. Dropping its backlog is the caller's next step
        (``delivery.detach.drop_backlog``), done after this commit so that a crash between
        the two never leaves an attached subscription whose fan-out has stopped."""
        rec = self.subscription(name)
        if rec.detached:
            return rec
        rec = replace(rec, detached=True, update_time=utc(self._clock()))
        source = pa.Table.from_pylist([_sub_row(rec)], schema=SUBSCRIPTIONS.schema).select(["name", "sub_uid", "detached", "update_time"])

        def fn(snap: Any) -> None:
            m = snap.merge(
                source, "t.name = s.name AND t.sub_uid = s.sub_uid",
                [MatchedUpdate({"detached": "s.detached", "update_time": "s.update_time"})],
            )
            if not m.get("num_target_rows_updated"):
                raise NotFound("subscription", name)

        self._engine.transact(SUBSCRIPTIONS.name, fn, what=f"detach subscription {name}")
        return rec

    def record_use(self, rec: SubscriptionRecord, when: float) -> None:
        """Set the subscription's ``last_active`` to `when` unless it is later already. ONE
        attempt (a conflict raises the engine's conflict error, and the caller's next use
        tries again): the caller may be a server round with pulls waiting on it. NotFound
        when it is gone."""
        source = pa.table({"name": [rec.name], "sub_uid": [rec.sub_uid]}).append_column(
            "last_active", pa.array([utc(when)], SUBSCRIPTIONS.schema.field("last_active").type)
        )
        later = "t.last_active IS NULL OR t.last_active < s.last_active"
        snap = self._engine.snapshot(SUBSCRIPTIONS.name)
        hit = snap.read(columns=["name"], filter=(pc.field("name") == rec.name) & (pc.field("sub_uid") == rec.sub_uid))
        if not hit.num_rows:
            raise NotFound("subscription", rec.name)
        snap.merge(source, "t.name = s.name AND t.sub_uid = s.sub_uid", [MatchedUpdate({"last_active": "s.last_active"}, when=later)])

    def delete_expired(self, now: float) -> list[SubscriptionRecord]:
        """Delete every subscription whose expiration policy says it expired at `now`
        (``policy.expiration.expired``), with its messages; return the deleted records.

        Each deletion commits only if the row still shows the use and the settings it was
        judged on: a use recorded since (another process) or an update since (a longer ttl)
        keeps the subscription. A row with no recorded use was written before expiration
        policies existed (creation records one): its clock starts now, so an upgrade never
        deletes a subscription that was in use. One subscription's failure does not stop
        the others (it is logged; the next run tries again)."""
        gone = []
        for rec in list(self.subscriptions().values()):
            try:
                if rec.last_active is None:
                    self.record_use(rec, now)
                    continue
                created = rec.create_time.timestamp() if rec.create_time is not None else now
                if expired(rec.expiration_policy.ttl, created, rec.last_active.timestamp(), now) and self._delete_unused(rec):
                    gone.append(rec)
            except NotFound:
                continue
            except Exception as exc:  # noqa: BLE001 - maintenance goes on with the others
                log.warning("expiring %s failed (%s); the next maintenance run tries again", rec.name, type(exc).__name__)
        return gone

    def _delete_unused(self, rec: SubscriptionRecord) -> bool:
        ts = SUBSCRIPTIONS.schema.field("last_active").type
        source = pa.table({
            "name": pa.array([rec.name], pa.string()), "sub_uid": pa.array([rec.sub_uid], pa.string()),
            "last_active": pa.array([rec.last_active], ts), "update_time": pa.array([rec.update_time], ts),
        })
        same = ("((t.last_active IS NULL AND s.last_active IS NULL) OR t.last_active = s.last_active)"
                " AND ((t.update_time IS NULL AND s.update_time IS NULL) OR t.update_time = s.update_time)")

        def fn(snap: Any) -> bool:
            m = snap.merge(source, "t.name = s.name AND t.sub_uid = s.sub_uid", [MatchedDelete(when=same)])
            return bool(m.get("num_target_rows_deleted"))

        if not self._engine.transact(SUBSCRIPTIONS.name, fn, what=f"expire subscription {rec.name}"):
            return False
        self._drop_messages(rec)
        return True

    def _drop_messages(self, rec: SubscriptionRecord) -> None:
        """Drop the lease state of a subscription whose registry row is gone (one commit)."""
        self._engine.transact(
            "deliveries", lambda snap: snap.delete(f"sub_uid = {literal(rec.sub_uid)}"), what=f"drop messages of {rec.name}",
        )

    def delete_subscription(self, name: str) -> SubscriptionRecord:
        rec = self.subscription(name)
        self._delete_named(SUBSCRIPTIONS.name, "subscription", name, "sub_uid", rec.sub_uid)
        # Its messages go at once: the registry row is gone (pull raises NotFound), and the
        # lease state of that sub_uid is dropped. A re-created subscription gets a new uid.
        self._drop_messages(rec)
        return rec
