"""Topic and subscription registries: small Delta tables, read through a version cache."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from .errors import AlreadyExists, NotFound
from .storage import Engine, MatchedDelete, MatchedUpdate, NotMatchedInsert, literal
from .storage.tables import SUBSCRIPTIONS, TOPICS
from .types import NoWrapper, OidcToken, PushConfig, Subscription, Topic

Clock = Callable[[], float]


def new_uid(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(8)}"


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: dt.datetime | None = None

    def public(self) -> Topic:
        return Topic(name=self.name, labels=dict(self.labels))


@dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    name: str
    sub_uid: str
    topic: str
    topic_uid: str
    push_config: PushConfig
    ack_deadline_seconds: int
    labels: Mapping[str, str]
    enable_message_ordering: bool
    start_version: int
    create_time: dt.datetime | None = None
    update_time: dt.datetime | None = None

    def public(self, topic_live: bool = True) -> Subscription:
        return Subscription(
            name=self.name,
            topic=self.topic if topic_live else "_deleted-topic_",
            push_config=self.push_config,
            ack_deadline_seconds=self.ack_deadline_seconds,
            labels=dict(self.labels),
            enable_message_ordering=self.enable_message_ordering,
        )


def _push_row(pc_: PushConfig) -> dict[str, Any]:
    return {
        "push_endpoint": pc_.push_endpoint,
        "attributes": list(pc_.attributes.items()),
        "oidc_token": None
        if pc_.oidc_token is None
        else {"service_account_email": pc_.oidc_token.service_account_email, "audience": pc_.oidc_token.audience},
        "no_wrapper": None if pc_.no_wrapper is None else {"write_metadata": pc_.no_wrapper.write_metadata},
    }


def _push_from_row(row: Mapping[str, Any] | None) -> PushConfig:
    if not row:
        return PushConfig()
    oidc = row.get("oidc_token")
    nowrap = row.get("no_wrapper")
    return PushConfig.stored(
        push_endpoint=row.get("push_endpoint") or "",
        attributes=dict(row.get("attributes") or []),
        oidc_token=OidcToken(**oidc) if oidc else None,
        no_wrapper=NoWrapper(**nowrap) if nowrap else None,
    )


def _sub_row(r: SubscriptionRecord) -> dict[str, Any]:
    return {
        "name": r.name,
        "sub_uid": r.sub_uid,
        "topic": r.topic,
        "topic_uid": r.topic_uid,
        "push_config": _push_row(r.push_config),
        "ack_deadline_seconds": r.ack_deadline_seconds,
        "labels": list(r.labels.items()),
        "enable_message_ordering": r.enable_message_ordering,
        "start_version": r.start_version,
        "create_time": r.create_time,
        "update_time": r.update_time,
    }


def _sub_from_row(row: Mapping[str, Any]) -> SubscriptionRecord:
    return SubscriptionRecord(
        name=row["name"],
        sub_uid=row["sub_uid"],
        topic=row["topic"],
        topic_uid=row["topic_uid"],
        push_config=_push_from_row(row.get("push_config")),
        ack_deadline_seconds=int(row["ack_deadline_seconds"]),
        labels=dict(row.get("labels") or []),
        enable_message_ordering=bool(row.get("enable_message_ordering")),
        start_version=int(row["start_version"]),
        create_time=row.get("create_time"),
        update_time=row.get("update_time"),
    )


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
        return self._load(
            TOPICS.name,
            lambda r: TopicRecord(r["name"], r["topic_uid"], dict(r.get("labels") or []), r.get("create_time")),
        )

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
            snap.merge(source, "t.name = s.name", [NotMatchedInsert(_all_columns(schema))])

        self._engine.transact(table, fn, what=f"create {kind} {row['name']}")

    def _delete_named(self, table: str, kind: str, name: str, uid_col: str, uid: str) -> None:
        source = pa.table({"name": [name], uid_col: [uid]})

        def fn(snap: Any) -> None:
            m = snap.merge(source, f"t.name = s.name AND t.{uid_col} = s.{uid_col}", [MatchedDelete()])
            if not m.get("num_target_rows_deleted"):
                raise NotFound(kind, name)

        self._engine.transact(table, fn, what=f"delete {kind} {name}")

    def create_topic(self, name: str, labels: Mapping[str, str]) -> TopicRecord:
        rec = TopicRecord(name, new_uid("t"), dict(labels), utc(self._clock()))
        row = {"name": rec.name, "topic_uid": rec.topic_uid, "labels": list(rec.labels.items()), "create_time": rec.create_time}
        self._insert_unique(TOPICS.name, TOPICS.schema, "topic", row)
        return rec

    def delete_topic(self, name: str) -> None:
        rec = self.topic(name)
        self._delete_named(TOPICS.name, "topic", name, "topic_uid", rec.topic_uid)

    def create_subscription(
        self,
        name: str,
        topic: TopicRecord,
        push_config: PushConfig,
        ack_deadline_seconds: int,
        labels: Mapping[str, str],
        enable_message_ordering: bool,
    ) -> SubscriptionRecord:
        # The subscription point: every message committed after this version is delivered.
        # Read before the subscription commits, so a publish that starts after
        # create_subscription returns always lands at a later version.
        start_version = self._engine.version("messages")
        now = utc(self._clock())
        rec = SubscriptionRecord(
            name=name,
            sub_uid=new_uid("s"),
            topic=topic.name,
            topic_uid=topic.topic_uid,
            push_config=push_config,
            ack_deadline_seconds=ack_deadline_seconds,
            labels=dict(labels),
            enable_message_ordering=enable_message_ordering,
            start_version=start_version,
            create_time=now,
            update_time=now,
        )
        self._insert_unique(SUBSCRIPTIONS.name, SUBSCRIPTIONS.schema, "subscription", _sub_row(rec))
        return rec

    def replace_subscription(self, rec: SubscriptionRecord) -> SubscriptionRecord:
        """Write new settings for a live subscription (same sub_uid: its messages stay)."""
        rec = replace(rec, update_time=utc(self._clock()))
        source = pa.Table.from_pylist([_sub_row(rec)], schema=SUBSCRIPTIONS.schema)
        settable = {c: f"s.{c}" for c in SUBSCRIPTIONS.schema.names if c not in ("name", "sub_uid", "create_time", "start_version")}

        def fn(snap: Any) -> None:
            m = snap.merge(source, "t.name = s.name AND t.sub_uid = s.sub_uid", [MatchedUpdate(settable)])
            if not m.get("num_target_rows_updated"):
                raise NotFound("subscription", rec.name)

        self._engine.transact(SUBSCRIPTIONS.name, fn, what=f"update subscription {rec.name}")
        return rec

    def delete_subscription(self, name: str) -> SubscriptionRecord:
        rec = self.subscription(name)
        self._delete_named(SUBSCRIPTIONS.name, "subscription", name, "sub_uid", rec.sub_uid)
        # Its messages go at once: the registry row is gone (pull raises NotFound), and the
        # lease state of that sub_uid is dropped. A re-created subscription gets a new uid.
        self._engine.transact(
            "deliveries",
            lambda snap: snap.delete(f"sub_uid = {literal(rec.sub_uid)}"),
            what=f"drop messages of {name}",
        )
        return rec
