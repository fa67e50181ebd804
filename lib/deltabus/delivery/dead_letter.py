"""Dead-letter topics (issue 13): a message delivered ``max_delivery_attempts`` times without
an ack is published to the dead-letter topic and acked on its subscription.

Contract.

- **When.** ``give_up_hook(max)`` is ``DeliveryHooks.give_up``: a candidate whose next
  attempt would be above ``max`` is given up instead of leased, so exactly ``max``
  deliveries happen first. Only rows already delivered are candidates (lease selection's
  available rows); the push job's in-flight ids are never.
- **How: a ``MarkedMove``** (``storage/keyed_steps``, ARCHITECTURE.md "Changing two
  tables") from the subscription's partition of ``deliveries`` to ``messages``, with
  ``app_id`` ``dlq:<sub_uid>`` (one per source partition, as MarkedMove requires).
  1. The decision MERGE (pull's, or the push batch's) MARKS the given-up rows with the
     move's key (``dead_letter_key``; merge's GIVE_UP clause) and carries the intent's app
     transaction. From then on leases and outcomes leave those rows alone (their clauses
     require ``dead_letter_key IS NULL``, ``selection.read_available`` skips them).
  2. ``copy`` appends one new message per marked row to the dead-letter topic, keyed by
     (``dlq:<sub_uid>``, key): a rerun is skipped.
  3. ``drop`` deletes the marked rows: the ack on the source.
- **Which way a crash fails.** Before commit 1: nothing happened; the next decision gives
  the message up again. After commit 1 (marked) or 2 (copied): the message is held (not
  leased) until the subscription's owner, which runs ``recover`` before every decision
  (pull, push batch), finishes the move; the copy is appended once whatever the number of
  reruns. So a message is never lost, never delivered after it was marked, and is in both
  places only between commits 2 and 3 (and a later run always completes 3).
- **The copy** (``carry``): a new message id, derived from (sub_uid, message id, key) so
  every rerun builds the same row (40 digits, see ``dead_letter_id``); data, attributes
  and ordering key of the source message (read from the messages table by id), plus ``CloudPubSubDeadLetterSourceDeliveryCount``
  (the deliveries made: the row's delivery_attempt), ``...SourceSubscription`` (the
  subscription id), ``...SourceSubscriptionProject`` (its project) and
  ``...SourceTopicPublishTime`` (the source message's publish time, RFC 3339 UTC with a Z).
  Its publish time is when the copy is made (Pub/Sub republishes); only one copy ever
  commits, so which rerun's clock it carries does not matter.
- **A dead-letter topic that no longer exists** (deleted after the policy was set; create
  and update refuse a missing one): ``mover`` returns None and the subscription's hooks
  lose ``give_up``, so the message stays on the subscription, unacked and delivered again
  (Pub/Sub keeps it too); the backlog counts such messages (``dead_letter_blocked``).
  Recreating the topic resumes dead-lettering at the next decision.

The default path (no dead-letter policy) runs none of this: no topic lookup, no recovery,
no mark. What every subscription pays is the ``dead_letter_key IS NULL`` term in lease
selection's scan filter and in the MERGE clauses (kept for all, not only for subscriptions
with a policy, so a move left marked when a policy was cleared can never be leased).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .. import names
from ..errors import NotFound
from ..registry import Registry, SubscriptionRecord, TopicRecord
from ..types import DeadLetterPolicy
from ..storage import Engine, MatchedUpdate, Snapshot, literal
from ..storage.keyed_steps import MarkedMove, UnfinishedMove
from ..storage.tables import DELIVERIES, MESSAGES
from ..timestamps import TS, to_us
from .attempt_limit import give_up_hook
from .hooks import DeliveryHooks
from .model import Op
from .payloads import read_payloads

__all__ = [
    "MARK_COLUMN",
    "ATTR_DELIVERY_COUNT",
    "ATTR_SUBSCRIPTION",
    "ATTR_PROJECT",
    "ATTR_PUBLISH_TIME",
    "give_up_hook",
    "app_id",
    "dead_letter_id",
    "copies_of",
    "backlog_figures",
    "source_attributes",
    "DeadLetterMover",
    "mover",
    "prepare",
    "with_key",
    "check_topic",
    "settle_before_change",
]

MARK_COLUMN = "dead_letter_key"
ATTR_DELIVERY_COUNT = "CloudPubSubDeadLetterSourceDeliveryCount"
ATTR_SUBSCRIPTION = "CloudPubSubDeadLetterSourceSubscription"
ATTR_PROJECT = "CloudPubSubDeadLetterSourceSubscriptionProject"
ATTR_PUBLISH_TIME = "CloudPubSubDeadLetterSourceTopicPublishTime"


def app_id(sub_uid: str) -> str:
    """The move's application id: one per source partition (subscription)."""
    return f"dlq:{sub_uid}"


def _digits(text: str, n: int) -> int:
    value: int = int(hashlib.sha256(text.encode()).hexdigest(), 16) % 10**n
    return value


def sub_tag(sub_uid: str) -> str:
    """8 digits naming the source subscription inside its copies' ids."""
    return f"{_digits(sub_uid, 8):08d}"


def dead_letter_id(sub_uid: str, message_id: str, key: int) -> str:
    """The copy's message id: a function of (subscription, message, move key) alone, so a
    rerun of the copy builds the same row. 40 digits (ack ids carry digit ids; published
    ids have 32, ``ids``): the source id's leading 16 (its publish time, so ids still sort
    roughly by time), ``sub_tag(sub_uid)`` (``copies_of`` counts a subscription's copies by
    it; two subscriptions share a tag with odds of 1 in 10^8), and 16 digits of a hash of
    all three."""
    return f"{message_id[:16]:0>16}{sub_tag(sub_uid)}{_digits(f'{sub_uid}/{message_id}/{key}', 16):016d}"


def copies_of(engine: Engine, sub: SubscriptionRecord, topic: TopicRecord) -> int:
    """How many of `sub`'s messages are on the dead-letter `topic` (reads the message_id
    column of that topic's partition only; for the backlog)."""
    ids = engine.snapshot(MESSAGES.name).read(columns=["message_id"], partition=topic.topic_uid)["message_id"].cast(pa.string())
    ours = pc.and_(pc.equal(pc.utf8_length(ids), 40), pc.equal(pc.utf8_slice_codeunits(ids, 16, 24), sub_tag(sub.sub_uid)))
    return int(pc.sum(pc.cast(ours, pa.int64())).as_py() or 0)


def rfc3339_us(us: int) -> str:
    """UTC RFC 3339 with a Z and 0, 3 or 6 fractional digits (as Pub/Sub's timestamps)."""
    t = dt.datetime.fromtimestamp(us // 1_000_000, tz=dt.timezone.utc)
    base, frac = t.strftime("%Y-%m-%dT%H:%M:%S"), us % 1_000_000
    if frac == 0:
        return base + "Z"
    if frac % 1000 == 0:
        return f"{base}.{frac // 1000:03d}Z"
    return f"{base}.{frac:06d}Z"


def source_attributes(sub_name: str, delivery_count: int, publish_time_us: int | None) -> dict[str, str]:
    """The four attributes Pub/Sub adds to a dead-lettered copy."""
    sub = names.parse_subscription(sub_name)
    attrs = {
        ATTR_DELIVERY_COUNT: str(int(delivery_count)),
        ATTR_SUBSCRIPTION: sub.resource_id,
        ATTR_PROJECT: sub.project,
    }
    if publish_time_us is not None:
        attrs[ATTR_PUBLISH_TIME] = rfc3339_us(publish_time_us)
    return attrs


def _carry(
    engine: Engine, sub: SubscriptionRecord, topic: TopicRecord, clock: Callable[[], float]
) -> Callable[[pa.Table, int], pa.Table]:
    """``MarkedMove.carry``: the dead-letter topic's new message rows for marked deliveries."""

    def carry(rows: pa.Table, key: int) -> pa.Table:
        ids = rows["message_id"].cast(pa.string())
        payloads = {r["message_id"]: r for r in read_payloads(engine, sub.topic_uid, ids).to_pylist()}
        attempts = rows["delivery_attempt"].to_pylist()
        out: dict[str, list[object]] = {c: [] for c in MESSAGES.schema.names}
        published = to_us(clock())
        for message_id, attempt in zip(ids.to_pylist(), attempts):
            src = payloads.get(message_id) or {}  # payload gone (retention): the copy says so by its attributes alone
            when = src.get("publish_time")
            when_us = None if when is None else to_us(when.timestamp())
            attributes = dict(src.get("attributes") or [])
            attributes.update(source_attributes(sub.name, int(attempt or 0), when_us))
            data = src.get("data") or b""
            out["topic_uid"].append(topic.topic_uid)
            out["topic"].append(topic.name)
            out["message_id"].append(dead_letter_id(sub.sub_uid, message_id, key))
            out["data"].append(data)
            out["attributes"].append(list(attributes.items()))
            out["ordering_key"].append(src.get("ordering_key") or "")
            out["publish_time"].append(published)
            out["size_bytes"].append(len(data) + sum(len(k.encode()) + len(v.encode()) for k, v in attributes.items()))
        table = pa.table({c: pa.array(v, MESSAGES.schema.field(c).type if c != "publish_time" else pa.int64())
                          for c, v in out.items()})
        return table.set_column(
            MESSAGES.schema.get_field_index("publish_time"), "publish_time", table["publish_time"].cast(TS)
        ).cast(MESSAGES.schema)

    return carry


@dataclass(frozen=True, slots=True)
class DeadLetterMover:
    """One subscription's dead-letter move, bound to its (existing) dead-letter topic."""

    sub: SubscriptionRecord
    topic: TopicRecord
    move: MarkedMove

    def recover(self, engine: Engine) -> list[int]:
        """Finish every move still marked (a crash's leftovers, or a racing owner's); the
        subscription's owner runs it before deciding. Returns the keys finished. Reads no
        row when the log's file statistics show no mark in the partition (the usual case).
        When the dead-letter topic was deleted meanwhile, the marks are released instead
        (``release``): the messages stay on the subscription."""
        if not may_hold_marks(engine.snapshot(DELIVERIES.name), self.sub.sub_uid):
            return []
        if not self._topic_lives(engine):
            release(engine, self.sub.sub_uid)
            return []
        return self.move.recover(engine)

    def finish(self, engine: Engine, key: int) -> None:
        """Copy then drop the rows marked `key` (each step skipped if done); when the
        dead-letter topic was deleted since this mover was made, release the marks instead,
        so no copy goes to a deleted topic while its message is dropped."""
        if not self._topic_lives(engine):
            release(engine, self.sub.sub_uid)
            return
        self.move.finish(engine, key)

    def _topic_lives(self, engine: Engine) -> bool:
        """The dead-letter topic this mover copies to still exists (the same one: a topic
        deleted and created again under the name has another uid and partition)."""
        now = Registry(engine, clock=lambda: 0.0).topics().get(self.topic.name)
        return now is not None and now.topic_uid == self.topic.topic_uid

    def mark(self, snap: Snapshot, parts: Sequence[pa.Table], txns: Sequence[tuple[str, int]]) -> tuple[list[pa.Table], list[tuple[str, int]], int | None]:
        """The decision's MERGE parts and app transactions with its GIVE_UP rows marked by a
        new move's key and the intent's transaction last; and that key. When the
        partition still holds an unfinished move (a racing owner's, between its commits),
        the GIVE_UP rows are left out this time (the rows stay available, and are given up
        by a later decision) and the key is None."""
        try:
            intent = self.move.begin(snap)
        except UnfinishedMove:
            return [p for p in parts if not _is_give_up(p)], list(txns), None
        return with_key(parts, intent.key), [*txns, intent.txn], intent.key


def may_hold_marks(snap: Snapshot, sub_uid: str) -> bool:
    """Whether the subscription's partition may hold marked rows: False only when every
    file's statistics say its ``dead_letter_key`` is all null (files without those
    statistics, such as ones written before the column existed, count as maybe)."""
    files = snap.file_stats(partition=sub_uid)
    if files.num_rows == 0:
        return False
    nulls, rows = f"null_count.{MARK_COLUMN}", "num_records"
    if nulls not in files.column_names or rows not in files.column_names:
        return True
    all_null = pc.equal(files[nulls].cast(pa.int64()), files[rows].cast(pa.int64()))
    return not bool(pc.all(pc.fill_null(all_null, False)).as_py())


def _is_give_up(part: pa.Table) -> bool:
    return part.num_rows > 0 and bool(pc.all(pc.equal(part["op"], Op.GIVE_UP.value)).as_py())


def with_key(parts: Sequence[pa.Table], key: int) -> list[pa.Table]:
    """`parts` with every GIVE_UP row carrying the move's `key` in ``dead_letter_key``. Pure."""
    out = []
    for part in parts:
        if part.num_rows and "op" in part.column_names:
            give_up = pc.equal(part["op"], Op.GIVE_UP.value)
            if pc.any(give_up).as_py():
                keys = pc.if_else(give_up, pa.scalar(key, pa.int64()), part[MARK_COLUMN])
                part = part.set_column(part.schema.get_field_index(MARK_COLUMN), MARK_COLUMN, keys)
        out.append(part)
    return out


def mover(engine: Engine, sub: SubscriptionRecord, clock: Callable[[], float], registry: Registry | None = None) -> DeadLetterMover | None:
    """The subscription's dead-letter move, or None when it has no dead-letter policy or its
    dead-letter topic does not exist (any more). Reads the topics registry only when a
    policy is set."""
    policy = sub.dead_letter_policy
    if policy is None:
        return None
    reg = registry if registry is not None else Registry(engine, clock=clock)
    topic = reg.topics().get(policy.dead_letter_topic)
    if topic is None:
        return None
    move = MarkedMove(
        source=DELIVERIES.name,
        partition_column="sub_uid",
        partition=sub.sub_uid,
        mark_column=MARK_COLUMN,
        target=MESSAGES.name,
        app_id=app_id(sub.sub_uid),
        carry=_carry(engine, sub, topic, clock),
    )
    return DeadLetterMover(sub, topic, move)


def prepare(
    engine: Engine, sub: SubscriptionRecord, hooks: DeliveryHooks, clock: Callable[[], float], registry: Registry | None = None
) -> tuple[DeliveryHooks, DeadLetterMover | None]:
    """Before a decision on `sub`: its hooks as they apply now, and its mover (recovered).

    With a dead-letter policy whose topic exists: every unfinished move is finished first
    (so ``begin`` will not refuse), and the hooks keep ``give_up``. Without a policy, or
    when the topic is gone: ``give_up`` is dropped (the message stays and is delivered
    again) and the mover is None. Without a policy nothing is read."""
    if hooks.give_up is None and sub.dead_letter_policy is None:
        return hooks, None
    found = mover(engine, sub, clock, registry)
    if found is None:
        release(engine, sub.sub_uid)  # a move left marked when its topic went: the messages stay
        return (replace(hooks, give_up=None) if hooks.give_up is not None else hooks), None
    found.recover(engine)
    return hooks, found


def release(engine: Engine, sub_uid: str) -> int:
    """Clear every mark in the subscription's partition: its unfinished moves are dropped,
    and their messages are leasable again (delivery_attempt kept). For a move whose
    dead-letter topic is gone, or whose policy was cleared with the topic gone: without
    this a row marked by a move that crashed before its copy would never be delivered
    nor moved. A copy that did reach the gone topic is unreachable there. Reads no row
    when the log's file statistics show no mark (the usual case). Returns how many."""
    if not may_hold_marks(engine.snapshot(DELIVERIES.name), sub_uid):
        return 0

    def attempt(snap: Snapshot) -> int:
        marked = snap.read(columns=["sub_uid", "message_id"], partition=sub_uid, filter=pc.is_valid(pc.field(MARK_COLUMN)))
        if marked.num_rows:
            on = f"t.sub_uid = {literal(sub_uid)} AND t.message_id = s.message_id"
            snap.merge(marked, on, [MatchedUpdate({MARK_COLUMN: "CAST(NULL AS BIGINT)"}, when=f"t.{MARK_COLUMN} IS NOT NULL")])
        return int(marked.num_rows)

    return engine.transact(DELIVERIES.name, attempt, what=f"release dead-letter marks of {sub_uid}")


def check_topic(registry: Registry, policy: DeadLetterPolicy | None) -> None:
    """At create and update: the policy's dead-letter topic must exist (Pub/Sub answers
    NOT_FOUND). Raises ``NotFound`` naming the field; called before anything is written."""
    if policy is not None and policy.dead_letter_topic not in registry.topics():
        raise NotFound("dead-letter topic (dead_letter_policy.dead_letter_topic)", policy.dead_letter_topic)


def settle_before_change(engine: Engine, sub: SubscriptionRecord, clock: Callable[[], float], registry: Registry) -> None:
    """Before a subscription's dead-letter policy changes: finish its unfinished moves with
    the policy they were decided under (a cleared or retargeted policy would otherwise
    leave marked rows that no mover of the new policy carries to the old topic)."""
    found = mover(engine, sub, clock, registry)
    if found is not None:
        found.recover(engine)
    elif sub.dead_letter_policy is not None:  # its topic is gone: nothing to finish the moves with
        release(engine, sub.sub_uid)


def backlog_figures(
    engine: Engine, sub: SubscriptionRecord, attempts: pa.Array | pa.ChunkedArray, clock: Callable[[], float]
) -> tuple[int | None, int | None]:
    """(dead_lettered, dead_letter_blocked) of the backlog for `sub`, given the
    delivery_attempt of (at least) its rows ever delivered; (None, None) without a policy.
    dead_lettered: its messages on the dead-letter topic (None when that topic is gone).
    dead_letter_blocked: messages past max_delivery_attempts that stay because the topic is
    gone (0 while it exists: those are moved at the next decision)."""
    policy = sub.dead_letter_policy
    if policy is None:
        return None, None
    topic = Registry(engine, clock=clock).topics().get(policy.dead_letter_topic)
    if topic is not None:
        return copies_of(engine, sub, topic), 0
    over = pc.greater(attempts, pa.scalar(policy.max_delivery_attempts, pa.int32()))
    return None, int(pc.sum(pc.cast(over, pa.int64())).as_py() or 0)
