"""One micro-batch's write to the deliveries table: fan-out, leases and outcomes in one MERGE.

Contract: ``execute`` composes the delivery core (``deltabus.delivery``) exactly as pull
does: per push subscription, fan-out from its cursor (the micro-batch's rows in the steady
state, the change feed while catching up), lease selection within the room the job grants
(outside its in-flight ids), then the outcomes the workers reported; all of it, the cursors
and the batch's application transaction, is ONE MERGE pinned to literal sub_uids. No lease,
fan-out or outcome logic lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import pyarrow as pa

from ..delivery import history as hist
from ..delivery.dead_letter import DeadLetterMover
from ..delivery.fanout import Fanout, catch_up_rows, from_batch
from ..delivery.hooks import DEFAULT_HOOKS, DeliveryHooks, hooks_for
from ..delivery.merge import LeasesRaced, applied_leases, commit
from ..delivery.history import RECORD, HistorySettings
from ..delivery.model import Op, OutcomeKind
from ..delivery.outcomes import decide, latest_per_message, nack_lease, read_current, rows as outcome_rows
from ..delivery.selection import ORDERED_READ_FACTOR, read_candidates, select
from ..policy.lease_start import FANOUT_LIMIT
from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot
from ..storage.tables import DELIVERIES
from ..timestamps import to_us


@dataclass(frozen=True, slots=True)
class SubPlan:
    """What the job may do for one push subscription in this batch."""

    sub: SubscriptionRecord
    room: int  # leases allowed now (window room, 0 while in backoff)
    exclude: frozenset[str] = frozenset()  # message ids in flight or with an outcome now
    # Its dead-letter move (``dead_letter.prepare``, run before the batch's transaction);
    # None: no policy, or its topic is gone, and nothing is given up.
    dead_letter: DeadLetterMover | None = None
    # How long its leases run from `now`: the ack deadline, plus the time the commit takes
    # (policy/lease_start.py); None = the ack deadline.
    lease_seconds: float | None = None

    @property
    def lease_length(self) -> float:
        return float(self.sub.ack_deadline_seconds) if self.lease_seconds is None else self.lease_seconds


@dataclass(slots=True)
class PlanResult:
    leases: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # sub_uid -> (message_id, attempt)
    fanned_out: int = 0
    committed: bool = False
    leased_at: float = 0.0  # the `now` the leases' deadlines count from
    lease_expires: dict[str, float] = field(default_factory=dict)  # sub_uid -> when its new leases end
    dead_letter_keys: dict[str, int] = field(default_factory=dict)  # sub_uid -> key of the move marked in this commit
    held_leases: bool = False  # fanned out over `lease_fanout_limit` rows, so leased nothing
    # The first subscription that leased nothing because its next message did not fit
    # `max_bytes`; the ones after it got no bytes (so the freed bytes add up for it; the job
    # serves it first next time).
    bytes_blocked: str | None = None


def catch_up_limit(room: int, policy: DeliveryHooks) -> int | None:
    """The most messages a lagging push subscription fans out in this batch
    (``fanout.catch_up_rows``), never more than lease_start.FANOUT_LIMIT; ``execute`` also
    shares FANOUT_LIMIT among the batch's lagging subscriptions, so the batch still grants
    leases (``fanout.catch_up`` says why). Its cursor moves by what it fanned out; the rest
    waits in the messages table, counted in the backlog as before. Pure."""
    return catch_up_rows(room, policy.eligible is not None, FANOUT_LIMIT)


def execute(
    engine: Engine,
    snap: Snapshot,
    plans: Sequence[SubPlan],
    outcomes: Mapping[str, tuple[pa.Table, pa.Table]],
    batch: pa.Table,
    first: int,
    last: int,
    *,
    now: float,
    batch_txn: tuple[str, int] | None,
    records: Mapping[str, SubscriptionRecord] | None = None,
    lease_fanout_limit: int | None = None,
    max_bytes: int | None = None,
    oversize_ok: bool = False,
    history: HistorySettings = RECORD,
) -> PlanResult:
    """Build and commit the batch's single MERGE. `outcomes`: sub_uid -> (acks, nacks) tables
    of (message_id, delivery_attempt). `batch`: the stream's rows (topic_uid, message_id,
    publish_time, ordering_key, size_bytes, version) of messages versions first..last.
    Called inside ``engine.transact``: a conflict reruns it. Writes nothing when there is
    nothing to write; commits the txns alone when only cursors (or the batch) move.
    `records` (by sub_uid) gives the policy of a subscription with outcomes but no plan (one
    that stopped being a push subscription while its pushes were out), so its nacks still
    get its retry delay. A batch fanning out more than `lease_fanout_limit` rows in all
    grants no leases (policy/lease_start.py: such a commit would eat them). `max_bytes`: the
    batch's leases, all subscriptions together, add up to at most this many bytes of
    messages (size_bytes), the subscriptions served in order; once one leases nothing because
    its next message does not fit, the ones after it get no bytes (``PlanResult.bytes_blocked``: the job serves it
    first next time, so bytes freed meanwhile are its, and a large message is not starved by
    smaller ones of other subscriptions); `oversize_ok`: the batch's first lease may be
    larger (the push queue is empty: ``selection.select``).

    `history` on: the delivery history of the leases, give-ups, expiries and push outcomes
    rides in the same MERGE (``delivery/history``), and the outcomes are decided on the
    snapshot (their current rows read first), so each is recorded as applied or stale and
    the MERGE must apply exactly those (else it reruns)."""
    parts: list[pa.Table] = []
    txns: list[tuple[str, int]] = []
    result = PlanResult(leased_at=now)
    hooks: dict[str, DeliveryHooks] = {}
    # Lagging subscriptions share what keeps the batch leasing (lease_fanout_limit), taken in
    # an order that turns with the batch, so none waits behind another for good; only the
    # first to take any of it may go over with one whole version (``fanout.catch_up``).
    by_index: dict[int, Fanout] = {}
    fanning = 0
    turn = (batch_txn[1] if batch_txn is not None else 0) % max(1, len(plans))
    for i in [*range(turn, len(plans)), *range(turn)]:
        plan = plans[i]
        policy = hooks[plan.sub.sub_uid] = hooks_for(plan.sub)
        if policy.give_up is not None and plan.dead_letter is None:  # dead-letter topic gone: the message stays
            policy = hooks[plan.sub.sub_uid] = replace(policy, give_up=None)
        limit = catch_up_limit(plan.room, policy)
        if limit is not None and lease_fanout_limit is not None:
            limit = min(limit, max(0, lease_fanout_limit - fanning))
        by_index[i] = from_batch(engine, snap, plan.sub, batch, first, last, keep=policy.keep, limit=limit, strict=fanning > 0)
        fanning += by_index[i].rows.num_rows
    fans = [by_index[i] for i in range(len(plans))]
    leasing = lease_fanout_limit is None or fanning <= lease_fanout_limit
    result.held_leases = not leasing
    bytes_left = max_bytes
    for plan, fan in zip(plans, fans):
        sub = plan.sub
        uid = sub.sub_uid
        policy = hooks[uid]
        room = plan.room if leasing else 0
        txns.extend(fan.txns(uid))
        # Ordering keys (issue 13): one outstanding message per key, counting the in-flight ids
        # (their keys are held) but not the ones this MERGE acks (the next of the key may go
        # now: a push round per message, not two).
        acked = frozenset(outcomes[uid][0]["message_id"].to_pylist()) if policy.eligible is not None and uid in outcomes else frozenset()
        available, keys = read_candidates(  # empty, reading nothing, when room <= 0
            snap, uid, now, room, policy, plan.exclude, acked, ORDERED_READ_FACTOR
        )
        chosen = select(uid, available, fan.rows, room, to_us(now + plan.lease_length), policy, keys,
                        max_bytes=bytes_left, oversize_ok=oversize_ok and not result.leases)
        if bytes_left is not None:
            bytes_left = max(0, bytes_left - chosen.leased_bytes)
            if chosen.bytes_blocked and not chosen.leases:  # its next message waits for bytes: none go past it
                bytes_left = 0
                if result.bytes_blocked is None:
                    result.bytes_blocked = uid
        chosen_parts = chosen.parts
        if chosen.given_up and plan.dead_letter is not None:  # marked in this MERGE; the job finishes the move after it
            chosen_parts, dl_txns, key = plan.dead_letter.mark(snap, chosen_parts, [])
            txns.extend(dl_txns)
            if key is not None:
                result.dead_letter_keys[uid] = key
        parts.extend(chosen_parts)
        parts.extend(hist.for_leases(history, sub.name, chosen_parts, available, to_us(now)))
        if chosen.leases:
            result.leases[uid] = [(lease.message_id, lease.delivery_attempt) for lease in chosen.leases]
            result.lease_expires[uid] = now + plan.lease_length
        result.fanned_out += chosen.inserted
    names = {**{uid: rec.name for uid, rec in (records or {}).items()}, **{p.sub.sub_uid: p.sub.name for p in plans}}
    decided = False
    for uid, (acks, nacks) in outcomes.items():
        policy = hooks.get(uid) or (hooks_for(records[uid]) if records and uid in records else DEFAULT_HOOKS)
        if history.enabled and (acks.num_rows or nacks.num_rows):
            parts.extend(_recorded_outcomes(snap, uid, names.get(uid, uid), acks, nacks, policy, now, history))
            decided = True
            continue
        if acks.num_rows:
            parts.append(outcome_rows(uid, OutcomeKind.ACK, acks))
        if nacks.num_rows:
            lease = nack_lease(policy, nacks, now)
            parts.append(outcome_rows(uid, OutcomeKind.NACK, nacks, lease))
    if not parts and not txns:
        return result
    if batch_txn is not None:
        txns.append(batch_txn)
    exact = frozenset({Op.ACK, Op.NACK}) if decided else frozenset()
    try:
        commit(snap, parts, sorted({p.sub.sub_uid for p in plans} | set(outcomes)), txns, exact=exact)
    except LeasesRaced as raced:
        # (delta-spark) Committed, with some leases refused: push the ones that applied. A
        # rerun would find the batch's transaction recorded and hand out nothing.
        won = applied_leases(engine.snapshot(DELIVERIES.name), raced)
        result.leases = {uid: kept for uid, items in result.leases.items() if (kept := [i for i in items if (uid, i[0]) in won])}
        result.lease_expires = {uid: t for uid, t in result.lease_expires.items() if uid in result.leases}
    result.committed = True
    return result


def _refs(table: pa.Table) -> list[tuple[str, int]]:
    return list(zip(table["message_id"].to_pylist(), table["delivery_attempt"].to_pylist()))


def _recorded_outcomes(
    snap: Snapshot,
    uid: str,
    name: str,
    acks: pa.Table,
    nacks: pa.Table,
    policy: DeliveryHooks,
    now: float,
    history: HistorySettings,
) -> list[pa.Table]:
    """One subscription's push outcomes decided on `snap` (``outcomes.decide``: only those whose
    delivery is current there apply), with their history rows: applied ones as push_ok or
    push_failed, the others as stale."""
    ids = pa.concat_arrays([c for t in (acks, nacks) for c in t["message_id"].chunks]) if acks.num_rows + nacks.num_rows else None
    current = read_current(snap, uid, ids.to_pylist() if ids is not None else [])
    out: list[pa.Table] = []
    applied: list[pa.Table] = []
    if acks.num_rows:
        d = decide(uid, OutcomeKind.ACK, _refs(acks), current)
        out.append(d.source)
        applied.append(d.source.select(["message_id", "delivery_attempt"]))
    if nacks.num_rows:
        refs = _refs(nacks)
        d = decide(uid, OutcomeKind.NACK, refs, current, nack_lease(policy, latest_per_message(refs), now))
        out.append(d.source)
        applied.append(d.source.select(["message_id", "delivery_attempt"]))
    both = pa.concat_tables([acks, nacks], promote_options="permissive") if acks.num_rows and nacks.num_rows else (acks if acks.num_rows else nacks)
    out.append(hist.for_push(history, name, both, pa.concat_tables(applied), to_us(now)))
    return out
