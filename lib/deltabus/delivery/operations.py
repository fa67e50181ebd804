"""The client-side delivery operations: pull, acknowledge, modify_deadline.

Contract: each call is ONE read-modify-write of the subscription's deliveries partition
inside ``engine.transact`` (a conflicting concurrent commit reruns it on a fresh
snapshot), and at most one commit. The time is read inside each attempt: a rerun after a
conflict leases from its own "now", so a lease is never granted already shortened or
expired. Built only from the core's pieces (cursor, fanout, selection, outcomes, merge);
the push job composes the same pieces in ``push/plan.py``.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import pyarrow as pa

from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot
from ..storage.clock import deadline
from ..storage.tables import DELIVERIES
from ..timestamps import to_us
from . import dead_letter, history as hist
from .cursor import IDLE_CURSOR_LAG, cursor_app_id
from .fanout import PULL_CATCH_UP_MIN, catch_up_rows, from_change_feed
from .hooks import DeliveryHooks, hooks_for, require_attached
from .history import HistorySettings, RECORD
from .merge import LeasesRaced, applied_leases, commit
from .model import Op
from .model import DeliveryRef, IdResult, Lease, OutcomeKind
from .outcomes import cascade, decide, latest_per_message, nack_lease, read_current, rows
from .selection import read_candidates, select


def pull(
    engine: Engine,
    sub: SubscriptionRecord,
    *,
    max_messages: int,
    lease_seconds: float,
    clock: Callable[[], float],
    hooks: DeliveryHooks | None = None,
    max_bytes: int | None = None,
    history: HistorySettings = RECORD,
) -> list[Lease]:
    """Lease up to max_messages available messages for lease_seconds; return the leases
    (redeliveries first, oldest first, then new messages in publish order). `max_bytes`:
    their size_bytes add up to at most this, except that the first goes even when larger
    (``selection.select``'s `oversize_ok`).

    New messages are fanned out from the cursor in the same MERGE. With nothing to lease,
    nothing is written, except that a cursor lagging IDLE_CURSOR_LAG versions behind
    (versions of other topics) is moved forward alone, and that with message ordering the
    leases a run-out lease ends (``policy.ordering.ran_out``) are ended."""
    policy = hooks if hooks is not None else hooks_for(sub)
    uid = sub.sub_uid
    # A dead-letter policy: finish unfinished moves first; a missing topic drops give_up.
    policy, dead = dead_letter.prepare(engine, sub, policy, clock)

    def fn(snap: Snapshot) -> tuple[list[Lease], int | None]:
        now = clock()
        fan = from_change_feed(engine, snap, sub, keep=policy.keep, limit=catch_up_rows(max_messages, policy.eligible is not None, floor=PULL_CATCH_UP_MIN))
        available, keys = read_candidates(snap, uid, now, max_messages, policy)
        if available.num_rows == 0 and fan.rows.num_rows == 0 and keys.ended.num_rows == 0:
            if fan.end - fan.cursor >= IDLE_CURSOR_LAG:  # nothing for this topic in a long range: move past it
                commit(snap, [], [uid], [(cursor_app_id(uid), fan.end)])
            return [], None
        # Granted until the storage's latest possible time (a StorageClock) + the lease: see deadline.
        chosen = select(uid, available, fan.rows, max_messages, to_us(deadline(clock, now, lease_seconds)), policy, keys,
                        max_bytes=max_bytes, oversize_ok=True)
        parts, txns, key = chosen.parts, fan.txns(uid), None
        if chosen.given_up and dead is not None:  # mark them in this commit (the move's intent)
            parts, txns, key = dead.mark(snap, parts, txns)
        # The history of these leases, give-ups and expiries rides in the same commit.
        parts = [*parts, *hist.for_leases(history, sub.name, parts, available, to_us(now))]
        try:
            commit(snap, parts, [uid], txns)
        except LeasesRaced as raced:
            # (delta-spark) Committed, but another writer leased some rows first: hand out the
            # leases that applied, so they do not sit unused for a whole ack deadline (the
            # mixed-engine split test measured such a batch). None applied: rerun.
            won = applied_leases(engine.snapshot(DELIVERIES.name), raced)
            if not won:
                raise
            return [lease for lease in chosen.leases if (uid, lease.message_id) in won], key
        return chosen.leases, key

    leases, key = engine.transact(DELIVERIES.name, fn, what=f"pull {sub.name}")
    if key is not None and dead is not None:
        dead.finish(engine, key)  # a crash before this leaves marks that the next pull's recover finishes
    return leases


# The outcome ops a results call decides on the snapshot (the cascade's rows may be refused).
DECIDED = frozenset({Op.ACK, Op.NACK, Op.DEADLINE})


def _outcome_kind(seconds: float) -> OutcomeKind:
    return OutcomeKind.NACK if seconds <= 0 else OutcomeKind.DEADLINE


def acknowledge(
    engine: Engine,
    sub: SubscriptionRecord,
    items: Sequence[DeliveryRef],
    *,
    history: HistorySettings = RECORD,
    clock: Callable[[], float] = time.time,
) -> int:
    """Ack (message_id, delivery_attempt) pairs; return how many messages this acked.

    Unknown, already-acked or superseded deliveries are ignored. Without the delivery
    history it reads nothing first; with it, the current rows of the acked messages are read
    (``_decided``) so each ack is recorded as applied or stale on the snapshot it commits on.
    SubscriptionDetached for a detached subscription."""
    require_attached(sub)
    if not items:
        return 0
    keyed = latest_per_message(items)
    source = rows(sub.sub_uid, OutcomeKind.ACK, keyed)

    def fn(snap: Snapshot) -> int:
        if history.enabled:
            return _decided(snap, sub, items, keyed, OutcomeKind.ACK, None, history, clock)
        m = commit(snap, [source], [sub.sub_uid])
        return int((m or {}).get("num_target_rows_deleted", 0))

    return engine.transact(DELIVERIES.name, fn, what=f"acknowledge {sub.name}")


def modify_deadline(
    engine: Engine,
    sub: SubscriptionRecord,
    items: Sequence[DeliveryRef],
    seconds: float,
    *,
    clock: Callable[[], float],
    hooks: DeliveryHooks | None = None,
    history: HistorySettings = RECORD,
) -> int:
    """Set the lease of the given deliveries to end `seconds` from now; 0 is a nack.
    Return how many deliveries changed.

    A nack ends the lease at the retry delay (the NACKED sentinel by default). An
    extension never applies to a nacked row, so one racing a nack cannot hold the message
    back. An extension that arrives just after its lease ran out still applies while
    nobody else has been given the message (the delivery attempt still matches)."""
    policy = hooks if hooks is not None else hooks_for(sub)  # refuses a detached subscription
    if not items:
        return 0
    keyed = latest_per_message(items)
    kind = _outcome_kind(seconds)

    def fn(snap: Snapshot) -> int:
        lease = _new_lease(kind, keyed, seconds, clock, policy)
        if kind is OutcomeKind.NACK and history.enabled:  # recorded: decided on the snapshot (``_decided``)
            return _decided(snap, sub, items, keyed, kind, lease, history, clock, policy)
        source = rows(sub.sub_uid, kind, keyed, lease)
        parts = [source]
        if kind is OutcomeKind.NACK and policy.eligible is not None:  # ordering: the key's later leases end too
            parts.append(cascade(sub.sub_uid, keyed, snap, clock()))
        m = commit(snap, parts, [sub.sub_uid])
        return int((m or {}).get("num_target_rows_updated", 0))

    return engine.transact(DELIVERIES.name, fn, what=f"modify_ack_deadline {sub.name}")


_RECORDED: dict[OutcomeKind, hist.AttemptOutcome] = {OutcomeKind.ACK: hist.ACK, OutcomeKind.NACK: hist.NACK}


def _decided(
    snap: Snapshot,
    sub: SubscriptionRecord,
    items: Sequence[DeliveryRef],
    keyed: pa.Table,
    kind: OutcomeKind,
    lease: int | pa.Array | None,
    history: HistorySettings,
    clock: Callable[[], float],
    policy: DeliveryHooks | None = None,
) -> int:
    """An ack or nack decided on `snap` (the current rows of its messages read first), with
    its history (applied, or stale) in the same commit; how many deliveries it changed. With
    message ordering (`policy`), the nacks that apply end their keys' later leases, as
    ``_with_results`` does."""
    current = read_current(snap, sub.sub_uid, keyed["message_id"].to_pylist())
    decision = decide(sub.sub_uid, kind, items, current, lease)
    parts = [decision.source]
    if kind is OutcomeKind.NACK and policy is not None and policy.eligible is not None:
        parts.append(cascade(sub.sub_uid, decision.source.select(["message_id", "delivery_attempt"]), snap, clock()))
    parts.append(hist.for_outcomes(history, sub.name, keyed, decision.source["message_id"], _RECORDED[kind], to_us(clock()),
                                   known=current["message_id"]))
    commit(snap, parts, [sub.sub_uid], exact=DECIDED)
    return int(decision.source.num_rows)


def _new_lease(
    kind: OutcomeKind, keyed: pa.Table, seconds: float, clock: Callable[[], float], policy: DeliveryHooks
) -> int | pa.Array | None:
    """The lease_expires a deadline change or nack sets (None: the NACKED sentinel); a
    nack's comes from ``outcomes.nack_lease``."""
    if kind is OutcomeKind.DEADLINE:
        return to_us(deadline(clock, clock(), seconds))
    return nack_lease(policy, keyed, clock())


def acknowledge_results(
    engine: Engine,
    sub: SubscriptionRecord,
    items: Sequence[DeliveryRef],
    *,
    history: HistorySettings = RECORD,
    clock: Callable[[], float] = time.time,
) -> list[IdResult]:
    """Ack (message_id, delivery_attempt) pairs; return the result of each, in order.

    Reads the current rows of those messages first (in the snapshot the MERGE commits on),
    so SUCCESS means this call acked it; nothing is written when no id applies (but its
    history: stale acks are recorded)."""
    return _with_results(engine, sub, items, OutcomeKind.ACK, 0.0, clock, hooks_for(sub), f"acknowledge {sub.name}", history)


def modify_deadline_results(
    engine: Engine,
    sub: SubscriptionRecord,
    items: Sequence[DeliveryRef],
    seconds: float,
    *,
    clock: Callable[[], float],
    hooks: DeliveryHooks | None = None,
    history: HistorySettings = RECORD,
) -> list[IdResult]:
    """``modify_deadline`` returning the result of each pair, in order (see acknowledge_results)."""
    policy = hooks if hooks is not None else hooks_for(sub)
    kind = _outcome_kind(seconds)
    return _with_results(engine, sub, items, kind, seconds, clock, policy, f"modify_ack_deadline {sub.name}", history)


def _with_results(
    engine: Engine,
    sub: SubscriptionRecord,
    items: Sequence[DeliveryRef],
    kind: OutcomeKind,
    seconds: float,
    clock: Callable[[], float],
    policy: DeliveryHooks,
    what: str,
    history: HistorySettings = RECORD,
) -> list[IdResult]:
    if not items:
        return []
    keyed = latest_per_message(items)

    def fn(snap: Snapshot) -> list[IdResult]:
        lease = _new_lease(kind, keyed, seconds, clock, policy) if kind is not OutcomeKind.ACK else None
        current = read_current(snap, sub.sub_uid, [item[0] for item in items])
        decision = decide(sub.sub_uid, kind, items, current, lease)
        parts = [decision.source]
        if kind in _RECORDED:  # the history of these outcomes, applied or stale, in the same commit
            parts.append(hist.for_outcomes(history, sub.name, keyed, decision.source["message_id"], _RECORDED[kind], to_us(clock()),
                                           known=current["message_id"]))
        if kind is OutcomeKind.NACK and policy.eligible is not None:  # ordering: the key's later leases end too
            parts.append(cascade(sub.sub_uid, decision.source.select(["message_id", "delivery_attempt"]), snap, clock()))
        # Decided after reading the rows: each must apply, or the results would lie (delta-spark).
        commit(snap, parts, [sub.sub_uid], exact=DECIDED)
        return decision.results

    return engine.transact(DELIVERIES.name, fn, what=what)
