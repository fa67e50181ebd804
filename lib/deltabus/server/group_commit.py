"""Group commit: the leases, acks and deadline changes of ALL callers of one subscription in one commit per round.

Contract.

- **Rounds.** ``GroupCommits`` keeps one queue per subscription. A call (a stream's or a
  unary Pull's lease ask, an Acknowledge, a ModifyAckDeadline, from the stream or unary)
  joins its subscription's queue and awaits its own answer. While no round runs, a call
  starts one at once; while one runs, calls queue, and the next round takes every queued
  call (natural batching: the busier the subscription, the larger each MERGE, and an idle
  one waits for nothing). A round runs on a worker thread (the delta-rs work blocks), so
  no stream holds a thread, and rounds of different subscriptions run side by side.
- **One round = one ``engine.transact``** (two when split, below) composing the delivery core exactly as
  ``delivery/operations.py`` pull / acknowledge / modify_deadline do (dead-letter
  ``prepare`` before, ``mark`` inside, ``finish`` after; fan-out from the cursor; the idle
  cursor moved alone past IDLE_CURSOR_LAG versions of other topics; the ordering nack
  cascade), so a commit conflict reruns the whole round on a fresh snapshot, reading the
  time again.
- **New messages first.** A round whose leases are all of new messages (fanned out in
  it, nothing leased again: ``merge.new_messages_only``) and that has outcomes too commits
  twice: the leases as an append (``merge.commit``), whose callers are answered at once
  (``run_round``'s `early`), then the outcomes' MERGE. Any other round is one commit.
  Why (measured, the real client's subscribe() at 500 msg/s against ``deltabus serve``):
  folded into the outcomes' MERGE, every new message waited for that MERGE (~17 ms of CPU
  whatever its size) before it was sent; as an append of its own (~3-7 ms) it is sent at
  once and the acks' MERGE follows. Ids with an outcome are never among new messages (they
  were delivered before), so the two commits decide nothing of each other.
- **Deferred changes** (a stream's receipt modacks, and acks made durable first by the
  server's journal, ``ack_journal``: both answered before they commit) start no round:
  they ride in the next round that has other outcomes (not in one of lease asks alone:
  ``_take``). Once one has waited `defer_seconds` (DEFER_SECONDS) it goes in the next
  round whatever that holds, or starts one. ``flush`` (a clean stop) commits them at once.
- **One row per message.** ``policy.round_outcomes.resolve`` keeps one outcome per message
  (latest delivery attempt; an ack wins; else the last deadline change in arrival order).
  Ids with an outcome in the round are left out of lease candidates. The nack cascade
  (ordering) leaves out messages acked in the round and replaces their deadline changes.
- **Leases** of a round are sized by the sum of the lease asks (at most
  ``MAX_ROUND_LEASES``) and split by ``round_outcomes.split`` (arrival order; ordering
  keys kept on one caller). Each caller's leases end ``lease_seconds`` after the round's
  time. Payloads are read once per round for all its leases.
- **Answers.** A lease ask gets ``Granted`` (its messages, when their leases end, and
  whether the subscription is exactly-once in the record the round read). An outcome ask
  gets one ``IdResult`` per id when it asked for results (the round then reads the rows of
  the messages first and applies only what the results say, as
  ``operations.acknowledge_results`` does), else None (nothing is read first). It asks
  for them with ``want_results``, or with ``results_if_exactly_once``: then only when the
  subscription's record, read by the round, has ``enable_exactly_once_delivery`` (issue
  15: the unary Acknowledge and ModifyAckDeadline need no read of their own to know). Ack ids of
  another subscription (or an earlier incarnation of this one) are ignored, with an
  INVALID_ACK_ID result. A failing round (the subscription deleted: NotFound; a storage
  error) fails every call in it with the same error, except the lease callers of a split
  round already answered after their commit (the outcome callers then fail alone). A
  clock known too loosely to set deadlines (``ClockUncertain``, storage/clock.py) is no
  round failure: it is decided once before the commit, the round's lease asks and deadline
  extensions are answered with it (their callers alone fail, and retry), and its acks and
  nacks commit.
- ``listen(fn)``: fn(ack ids, seconds) is called on the event loop when an outcome is
  submitted (seconds None = ack, 0 = nack): StreamingPull's flow control counts a message
  done when its ack arrives, whichever path it takes.

Why no linger before a round, only a few passes of the event loop (``JOIN_YIELDS``):
measured earlier here, a 3 ms linger folded each lease into the ack round but those
rounds took ~70 ms and subscribe() fell from 1,177 to 977 msg/s (a MERGE costs ~18 ms
whatever its size, so the lever is larger rounds, not fewer). The yields wait for no
time: they let the stream that an Acknowledge freed room on (``StreamHub._settle``
wakes it) put its lease ask into the ack's own round, instead of the alternation of
an ack round and a lease round, each a MERGE. Measured with bench/server.py's pull
phase (5,000 pre-published messages, 1 subscribe() client, back to back on this
shared machine): 92 -> 51 deliveries MERGEs (one per ack call of the client),
server CPU 0.78 -> 0.40 ms/msg, 1,202 -> 2,446 msg/s.

The one wait for time is for peers (``PEER_LINGER``, at most 15 ms): a round with acks
waits until every other stream of the subscription with messages outstanding has queued
an outcome too. Without it, 4 subscribe() clients (processes, 8,000 pre-published
messages) locked into alternating rounds of 1 and 3 ack calls, each a ~35-40 ms MERGE;
with it, one round of all 4 (plus their lease asks, after JOIN_YIELDS more passes):
deliveries MERGEs 44 -> 24, server CPU 0.30 / 0.40 -> 0.21 / 0.31 ms/msg, 3,112 / 1,854 ->
3,673 / 3,042 msg/s (two A/B pairs, back to back). One client waits for nothing (it is
its own only peer), nor does a round without acks of a known stream (a nack), nor one
holding a lease ask of a stream with no ack queued (woken by new messages), nor one whose
ack calls are all small (< PEER_LINGER_IDS ids: the clients keep up). Measured with 4
clients at 500 msg/s before those two rules, lingering on every ack round moved
publish -> callback p50 144 / 143 -> 152 / 164 ms. With them, the pull runs above again
(a busier machine): 1,377 / 2,261 -> 2,810 / 3,053 msg/s, 0.55 / 0.43 -> 0.34 / 0.34 ms/msg.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any, Callable, NamedTuple, Sequence, Union

import pyarrow as pa
import pyarrow.compute as pc

from .. import ackid
from ..delivery import dead_letter, history as hist
from ..delivery.history import OFF, HistorySettings
from ..delivery.cursor import IDLE_CURSOR_LAG, cursor_app_id
from ..delivery.cursor import pending_range, read_unfanned
from ..delivery.fanout import MAX_FANOUT_VERSIONS, PULL_CATCH_UP_MIN, Fanout, catch_up, catch_up_rows, prepare
from ..delivery.hooks import DeliveryHooks, FanoutFilter, hooks_for
from ..delivery.merge import commit, new_messages_only
from ..delivery.operations import DECIDED
from ..delivery.model import IdResult, Lease, Op, OutcomeKind, Result
from ..delivery.outcomes import cascade, decide, latest_per_message, nack_lease, read_current, rows
from ..delivery.payloads import fetch_messages, received_messages
from ..delivery.selection import read_candidates, select
from ..errors import Cancelled, ClockUncertain, FailedPrecondition, NotFound, SubscriptionDetached, export_pull_refused
from ..policy.round_outcomes import Outcome, resolve, result_of, split
from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot
from ..storage.clock import deadline
from ..storage.tables import DELIVERIES
from ..timestamps import to_us
from ..types import ReceivedMessage
from .own_commits import OwnCommits
from .payload_cache import PayloadCache
from .rounds import fail_all, run_off_loop, settle

log = logging.getLogger(__name__)

# The most leases one round grants (all its callers together): bounds a round's MERGE and
# payload read when hundreds of streams ask at once.
MAX_ROUND_LEASES = 5000


class LeaseAsk(NamedTuple):
    """Lease up to `max_messages` for `lease_seconds` (a stream's or a unary Pull's ask;
    None: the subscription's ack deadline)."""

    max_messages: int
    lease_seconds: float | None


class OutcomeAsk(NamedTuple):
    """Outcomes for ack ids of one call, in request order. `seconds` None: ack; 0: nack;
    > 0: the lease ends that many seconds after the round's time."""

    ids: tuple[ackid.AckId, ...]
    seconds: float | None
    want_results: bool = False
    results_if_exactly_once: bool = False  # results too when the round finds the subscription exactly-once


Ask = Union[LeaseAsk, OutcomeAsk]


class Granted(NamedTuple):
    messages: list[ReceivedMessage]
    lease_end: float  # clock time the leases end (the round's time + lease_seconds)
    exactly_once: bool = False  # the subscription's enable_exactly_once_delivery (the record the round read)
    # False when the round leased everything leasable in its snapshot (it filled less than its
    # room and read the messages table to its end): asking again at once would find nothing.
    more: bool = True


# A lease ask on a push subscription is answered with FailedPrecondition (its call alone fails).
Answer = Union[Granted, list[IdResult], None, FailedPrecondition]


class _Decided(NamedTuple):
    now: float
    leases: list[Lease]
    assign: list[list[int]]
    applied: dict[str, bool] | None
    dead_key: int | None
    outcomes_left: bool = False  # the leases committed alone (an append); the outcomes commit next
    more: bool = True  # Granted.more


# Lease answers handed over before the round ends: {index of the ask in the round: its answer}.
EarlyAnswers = Callable[[dict[int, "Answer"]], None]


def run_round(
    engine: Engine,
    sub: SubscriptionRecord,
    asks: Sequence[Ask],
    clock: Callable[[], float],
    *,
    max_leases: int = MAX_ROUND_LEASES,
    cache: PayloadCache | None = None,
    early: EarlyAnswers | None = None,
    own: OwnCommits | None = None,
    history: HistorySettings = OFF,
    messages_version: Callable[[], int] | None = None,
    held: frozenset[str] = frozenset(),
) -> list[Answer]:
    """Run one round for `asks` (arrival order) on `sub`; return each ask's answer. Blocking.

    `early`: called (on this thread) with the lease asks' answers when the round commits its
    leases before its outcomes (the module docstring); the returned list has them too.
    `own`: the messages-table versions this server appended (``fan_out``). `history` on:
    the round's leases, acks and nacks are recorded in its commits (``delivery/history``),
    its outcomes then always decided on the snapshot (as when results are wanted).
    `messages_version`: the messages table's latest version (``fan_out``). `held`: message
    ids not to lease whatever their rows say (acks queued for a later round)."""
    uid = sub.sub_uid
    lease_idx = [i for i, a in enumerate(asks) if isinstance(a, LeaseAsk)]
    out_idx = [i for i, a in enumerate(asks) if isinstance(a, OutcomeAsk)]
    lease_asks = [a for a in asks if isinstance(a, LeaseAsk)]
    all_outcome_asks = [a for a in asks if isinstance(a, OutcomeAsk)]
    policy = hooks_for(sub)
    dead: dead_letter.DeadLetterMover | None = None
    push = sub.push_config.is_push  # pull needs an empty push endpoint: no leases, outcomes still apply
    exported = sub.delta_config is not None  # only the deliver job's exporter leases an export subscription
    wants = [0 if push or exported else max(0, a.max_messages) for a in lease_asks]
    # A clock known too loosely (ClockUncertain) is decided once, before the commit: the
    # lease asks and deadline extensions (which need the storage's latest time) are answered
    # with it alone; the round's acks and nacks still commit (the caller's other calls too).
    extends = [a.seconds is not None and a.seconds > 0 for a in all_outcome_asks]
    refused = _clock_refusal(clock) if (not push and sum(wants) > 0) or any(extends) else None
    room = 0 if refused is not None else min(sum(wants), max_leases)
    if room > 0:  # as pull: finish unfinished moves first; a missing topic drops give_up
        policy, dead = dead_letter.prepare(engine, sub, policy, clock)
    kept = [not (refused is not None and e) for e in extends]
    outcome_asks = [a for a, k in zip(all_outcome_asks, kept) if k]
    flat = [Outcome(i.message_id, i.delivery_attempt, a.seconds, i.message_version)
            for a in outcome_asks for i in a.ids if i.sub_uid == uid]
    winners = resolve(flat)
    wanted = [a.want_results or (a.results_if_exactly_once and sub.enable_exactly_once_delivery) for a in outcome_asks]
    want = any(wanted)
    read_first = want or history.enabled  # outcomes read and decided on the snapshot
    lease_secs = [float(sub.ack_deadline_seconds) if a.lease_seconds is None else a.lease_seconds for a in lease_asks]

    def fn(snap: Snapshot) -> _Decided:
        now = clock()
        txns: list[tuple[str, int]] = []
        leases: list[Lease] = []
        assign: list[list[int]] = [[] for _ in lease_asks]
        lease_parts: list[pa.Table] = []
        key = None
        more = True
        if room > 0:
            fan, latest = fan_out(engine, snap, sub, policy.keep, own, catch_up_rows(room, policy.eligible is not None, floor=PULL_CATCH_UP_MIN),
                                  messages_version)
            available, keys = read_candidates(snap, uid, now, room, policy, frozenset(winners) | held)
            if available.num_rows or fan.rows.num_rows or keys.ended.num_rows:
                start = deadline(clock, now, 0.0)  # the storage's latest possible time now (storage/clock.py)
                chosen = select(uid, available, fan.rows, room, to_us(start + max(lease_secs)), policy, keys)
                chosen_parts, chosen_txns = chosen.parts, fan.txns(uid)
                if chosen.given_up and dead is not None:  # marked in this commit (the move's intent)
                    chosen_parts, chosen_txns, key = dead.mark(snap, chosen_parts, chosen_txns)
                leases = chosen.leases
                order_keys = _keys_of(leases, available, fan.rows) if policy.eligible is not None else [""] * len(leases)
                assign = split(order_keys, wants)
                if len(set(lease_secs)) > 1:
                    ends = {leases[k].message_id: to_us(start + lease_secs[j]) for j, ks in enumerate(assign) for k in ks}
                    chosen_parts = [_reexpire(p, ends) for p in chosen_parts]
                lease_parts = [*chosen_parts, *hist.for_leases(history, sub.name, chosen_parts, available, to_us(now))]
                txns.extend(chosen_txns)
                # (ordering keys: a key held back may leave room while others wait unread)
                more = len(leases) >= room or fan.end < latest or chosen.given_up > 0 or policy.eligible is not None
            else:
                more = fan.end < latest
                if fan.end - fan.cursor >= IDLE_CURSOR_LAG:  # nothing for this topic in a long range: move past it
                    txns.append((cursor_app_id(uid), fan.end))
        if winners and new_messages_only(snap, lease_parts, txns):  # the leases first, as an append: why below
            commit(snap, lease_parts, [uid], txns)
            return _Decided(now, leases, assign, None, key, outcomes_left=True, more=more)
        parts, applied = _outcome_parts(snap, uid, winners, read_first, now, policy, clock, history, sub.name)
        commit(snap, _merge_cascades(parts + lease_parts), [uid], txns, exact=DECIDED if read_first else frozenset())
        return _Decided(now, leases, assign, applied, key, more=more)

    if not winners and room <= 0:
        decided = _Decided(clock(), [], [[] for _ in lease_asks], {} if want else None, None)
    else:
        decided = engine.transact(DELIVERIES.name, fn, what=f"group commit {sub.name}")
    if decided.dead_key is not None and dead is not None:
        dead.finish(engine, decided.dead_key)  # a crash before this leaves marks the next round's recover finishes
    answers: list[Answer] = [None] * len(asks)
    leases = decided.leases
    payloads = _payloads(engine, sub.topic_uid, [l.message_id for l in leases], cache) if leases else {}
    with_attempts = sub.dead_letter_policy is not None  # Pub/Sub fills delivery_attempt only then
    for j, i in enumerate(lease_idx):
        if push:
            answers[i] = FailedPrecondition(f"{sub.name} is a push subscription; pull needs an empty push endpoint")
            continue
        if exported:
            answers[i] = FailedPrecondition(export_pull_refused(sub.name))
            continue
        if refused is not None:
            answers[i] = refused
            continue
        got = received_messages(uid, sub.name, [leases[k] for k in decided.assign[j]], payloads, with_attempts=with_attempts)
        answers[i] = Granted(got, decided.now + lease_secs[j], sub.enable_exactly_once_delivery, decided.more)
    applied = decided.applied
    if decided.outcomes_left:
        if early is not None:
            early({i: answers[i] for i in lease_idx})

        def outcomes(snap: Snapshot) -> dict[str, bool] | None:
            parts, applied = _outcome_parts(snap, uid, winners, read_first, clock(), policy, clock, history, sub.name)
            commit(snap, parts, [uid], exact=DECIDED if read_first else frozenset())
            return applied

        applied = engine.transact(DELIVERIES.name, outcomes, what=f"group commit {sub.name}")
    for i, k in zip(out_idx, kept):
        if not k:
            answers[i] = refused
    for a, i, asked in zip(outcome_asks, [i for i, k in zip(out_idx, kept) if k], wanted):
        if asked and applied is not None:
            ok = applied
            answers[i] = [
                IdResult(x.message_id, x.delivery_attempt,
                         Result.SUCCESS if x.sub_uid == uid and result_of(
                             Outcome(x.message_id, x.delivery_attempt, a.seconds, x.message_version), winners.get(x.message_id),
                             ok.get(x.message_id, False)) else Result.INVALID_ACK_ID)
                for x in a.ids
            ]
    return answers


def fan_out(
    engine: Engine, snap: Snapshot, sub: SubscriptionRecord, keep: FanoutFilter | None, own: OwnCommits | None,
    limit: int | None = None,
    messages_version: Callable[[], int] | None = None,
) -> tuple[Fanout, int]:
    """``fanout.from_change_feed`` and the messages table's version it read up to, with the
    versions this server appended itself taken from `own` instead of the change feed (the
    same rows: ``own_commits``). Why (measured here, one round of 10 new messages after
    each publish, no other load): a lease round took 19.3 ms of CPU (p50) reading the
    change feed, 12.2 ms with this; it is on the path of every new message to its stream.
    `limit`: at most that many messages, in whole versions (``fanout.catch_up``'s rule).
    `messages_version`: the table's latest version, known without refreshing the engine's
    handle of it (the server's log watcher: one stat). Why (measured, bench/server.py's latency
    phase at 500 msg/s, ~50 publish commits a second): the refresh lists the table's log,
    which only Delta's 30-day retention cleans, so it cost 2.5-5 ms a round after 20 s and
    grows with every commit (0.4 / 1.3 / 2.4 ms at 100 / 1,000 / 3,000 log files with
    nothing new to read)."""
    cursor, latest = pending_range(engine, snap, sub, None if messages_version is None else messages_version())
    end = min(latest, cursor + MAX_FANOUT_VERSIONS)
    attributes = keep is not None

    def read(a: int, b: int) -> pa.Table:
        if own is None:
            return read_unfanned(engine, sub, a, b, attributes=attributes)
        return own.fanout(sub.topic_uid, a, b, attributes, lambda x, y: read_unfanned(engine, sub, x, y, attributes=attributes))

    if limit is not None:
        return catch_up(engine, sub, cursor, latest, limit, keep, read=read), latest
    rows = read(cursor + 1, end)
    return Fanout(prepare(rows, keep), cursor, end), latest


def _clock_refusal(clock: Callable[[], float]) -> ClockUncertain | None:
    """The ``ClockUncertain`` a deadline from `clock` would raise now, or None."""
    try:
        deadline(clock, clock(), 0.0)
    except ClockUncertain as exc:
        return exc
    return None


def _payloads(engine: Engine, topic_uid: str, ids: list[str], cache: PayloadCache | None) -> dict[str, dict[str, Any]]:
    """The leased messages' payloads: from `cache` (this server's recent publishes) where it
    has them, the rest from the messages table."""
    if cache is None:
        return fetch_messages(engine, topic_uid, ids)
    found, missing = cache.get(topic_uid, ids)
    if missing:
        found.update(fetch_messages(engine, topic_uid, missing))
    return found


def _pairs(outcomes: Sequence[Outcome]) -> pa.Table:
    return pa.table({
        "message_id": pa.array([o.message_id for o in outcomes], pa.string()),
        "delivery_attempt": pa.array([o.delivery_attempt for o in outcomes], pa.int32()),
        "message_version": pa.array([o.message_version for o in outcomes], pa.int64()),
    })


def _outcome_parts(
    snap: Snapshot, uid: str, winners: dict[str, Outcome], want: bool, now: float, policy: DeliveryHooks,
    clock: Callable[[], float],
    history: HistorySettings = OFF,
    name: str = "",
) -> tuple[list[pa.Table], dict[str, bool] | None]:
    """The round's outcome source rows (one per message) and, when `want`, which applied.
    `now` was read from `clock`; deadline changes run from ``storage.clock.deadline``.
    `history` on (needs `want`): the acks' and nacks' history rows, applied or stale, come too."""
    applied: dict[str, bool] | None = {} if want else None
    if not winners:
        return [], applied
    acks = [w for w in winners.values() if w.seconds is None]
    nacks = [w for w in winners.values() if w.seconds is not None and w.seconds <= 0]
    moves = [w for w in winners.values() if w.seconds is not None and w.seconds > 0]
    current = read_current(snap, uid, list(winners)) if want else None
    groups: list[tuple[OutcomeKind, list[Outcome], int | pa.Array | None]] = []
    if acks:
        groups.append((OutcomeKind.ACK, acks, None))
    if nacks:
        groups.append((OutcomeKind.NACK, nacks, nack_lease(policy, _pairs(nacks), now)))
    if moves:
        start = deadline(clock, now, 0.0)
        groups.append((OutcomeKind.DEADLINE, moves, pa.array([to_us(start + float(w.seconds or 0)) for w in moves], pa.int64())))
    parts: dict[OutcomeKind, pa.Table] = {}
    recorded: list[pa.Table] = []
    for kind, group, lease in groups:
        if current is None:
            parts[kind] = rows(uid, kind, _pairs(group), lease)
        else:
            d = decide(uid, kind, [(w.message_id, w.delivery_attempt, w.message_version) for w in group], current, lease)
            assert applied is not None
            for r in d.results:
                applied[r.message_id] = r.result is Result.SUCCESS
            parts[kind] = d.source
            if kind in _RECORDED:
                refs = [(w.message_id, w.delivery_attempt, w.message_version) for w in group]
                recorded.append(hist.for_outcomes(history, name, latest_per_message(refs), d.source["message_id"], _RECORDED[kind], to_us(now),
                                                  known=current["message_id"]))
    nacked = parts.get(OutcomeKind.NACK)
    if nacked is not None and nacked.num_rows and policy.eligible is not None:  # ordering: the key's later leases end too
        ended = cascade(uid, nacked.select(["message_id", "delivery_attempt"]), snap, now)
        acked = parts.get(OutcomeKind.ACK)
        if acked is not None and acked.num_rows and ended.num_rows:  # acked first, as if committed before the nack
            ended = ended.filter(pc.invert(pc.is_in(ended["message_id"], acked["message_id"])))
        moved = parts.get(OutcomeKind.DEADLINE)
        if moved is not None and moved.num_rows and ended.num_rows:  # the extension applied, then the cascade ended it
            parts[OutcomeKind.DEADLINE] = moved.filter(pc.invert(pc.is_in(moved["message_id"], ended["message_id"])))
        parts[OutcomeKind.EXPIRY] = ended  # (key only: CASCADE rows)
    return [p for p in [*parts.values(), *recorded] if p.num_rows], applied


_RECORDED: dict[OutcomeKind, hist.AttemptOutcome] = {OutcomeKind.ACK: hist.ACK, OutcomeKind.NACK: hist.NACK}


def _merge_cascades(parts: list[pa.Table]) -> list[pa.Table]:
    """One CASCADE row per message: the nack cascade and a run-out lease's cascade may both
    end the same follower (same delivery, same effect)."""
    cascades = [p for p in parts if p.num_rows and p["op"][0].as_py() == Op.CASCADE.value]
    if len(cascades) < 2:
        return parts
    rest = [p for p in parts if not (p.num_rows and p["op"][0].as_py() == Op.CASCADE.value)]
    both = pa.concat_tables(cascades)
    seen: set[str] = set()
    keep = []
    for m in both["message_id"].to_pylist():
        keep.append(m not in seen)
        seen.add(m)
    return rest + [both.filter(pa.array(keep, pa.bool_()))]


def _keys_of(leases: Sequence[Lease], available: pa.Table, fresh: pa.Table) -> list[str]:
    """The ordering key of each lease (from the candidate rows it was chosen from)."""
    keys: dict[str, str] = {}
    for t in (available, fresh):
        if t.num_rows and "ordering_key" in t.column_names:
            keys.update(zip(t["message_id"].cast(pa.string()).to_pylist(), t["ordering_key"].cast(pa.string()).to_pylist()))
    return [keys.get(l.message_id) or "" for l in leases]


def _reexpire(part: pa.Table, ends: dict[str, int]) -> pa.Table:
    """LEASE / INSERT rows with each leased message's own lease end (callers asked for different lengths)."""
    if not part.num_rows or part["op"][0].as_py() not in (Op.LEASE.value, Op.INSERT.value):
        return part
    col = part.schema.get_field_index("lease_expires")
    old = part["lease_expires"].cast(pa.int64()).to_pylist()
    new = [None if v is None else ends.get(m, v) for m, v in zip(part["message_id"].to_pylist(), old)]
    return part.set_column(col, part.schema.field(col), pa.array(new, pa.int64()).cast(part.schema.field(col).type))


# -- the event-loop side ------------------------------------------------------------------
def ack_moot(exc: BaseException) -> bool:
    """Whether a round's failure makes a deferred (journaled) ack moot, counted done and not
    queued again: its subscription is gone, or detached (the detach dropped its backlog).
    Any other error (a clock known too loosely, a conflict, storage) leaves the ack to
    commit later."""
    return (isinstance(exc, NotFound) and exc.kind == "subscription") or isinstance(exc, SubscriptionDetached)


Listener = Callable[[Sequence[ackid.AckId], Union[float, None]], None]


class _Pending(NamedTuple):
    ask: Ask
    future: asyncio.Future[Answer]
    # A deferred deadline change (``submit_modify_deadline(..., defer=True)``): the clock
    # time its leases end.
    until: float | None = None
    # Who sent an outcome (a stream, for ``peers``): None when unknown.
    source: object = None
    # Deferred (a deadline change as above, or a journaled ack: ``submit_acknowledge``): it
    # starts no round of its own (``_take``).
    deferred: bool = False
    since: float = 0.0  # the event loop's time it was queued


# Event-loop passes a drain waits before taking its first round: a stream woken by an ack
# needs ~3 (the wake-up, wait_for's return, its lease ask) to queue its ask (module docstring).
JOIN_YIELDS = 4

# Seconds a deferred change waits for a round to ride in before it goes in the next round
# whatever that round holds, or starts one (``GroupCommits``' `defer_seconds`).
DEFER_SECONDS = 0.5

# Seconds a round with outcomes waits at most for the outcomes of the subscription's other
# busy streams (``GroupCommits``' `peers`) before it starts without them. Why (measured,
# 4 subscribe() clients acking 8,000 messages): each client's acks arrive a few ms after its
# previous ack call is answered, so without it the clients locked into two alternating
# rounds (1 ack call, then 3: ~35 and ~40 ms of MERGE each) instead of one of all 4.
PEER_LINGER = 0.015
# ... and only when an ack call queued carries at least this many ids: its client is behind
# (the Python client sends at most 100 per call), so grouping pays; a client that keeps up
# sends small calls, and a round waits for no one (publish -> callback latency).
PEER_LINGER_IDS = 50


class GroupCommits:
    """The server's group commit: one queue per subscription (see the module docstring).

    `lookup(name)` returns the subscription's current record (NotFound when it is gone);
    it runs on the round's worker thread, once per round. `executor`: where rounds run
    (None: the loop's default executor). Call every method on the event loop."""

    def __init__(
        self,
        engine: Engine,
        lookup: Callable[[str], SubscriptionRecord],
        clock: Callable[[], float],
        *,
        executor: Executor | None = None,
        max_leases: int = MAX_ROUND_LEASES,
        cache: PayloadCache | None = None,
        on_use: Callable[[SubscriptionRecord], None] | None = None,
        own: OwnCommits | None = None,
        peers: Callable[[str], frozenset[object]] | None = None,
        history: HistorySettings = OFF,
        messages_version: Callable[[], int] | None = None,
        defer_seconds: float = DEFER_SECONDS,
    ) -> None:
        """`on_use(record)`: called after each round that committed (the subscription was
        used: ``activity.ActivityRecorder.used``), on the round's thread. `peers(name)`: the
        sources (streams) of the subscription expected to send outcomes soon (those with
        messages outstanding); a round with outcomes waits up to PEER_LINGER for each of
        them to queue one (on the event loop). `messages_version()`: the messages table's
        latest version, called on the round's thread (``fan_out``). `defer_seconds`: the
        longest a deferred change waits for a round to ride in (DEFER_SECONDS)."""
        self._defer_seconds = defer_seconds
        self._flushing = False
        # subscription -> the futures of its deferred acks not yet done -> their message ids
        self._deferred_acks: dict[str, dict[asyncio.Future[Answer], tuple[str, ...]]] = {}
        self._forced: set[str] = set()  # subscriptions whose deferred changes go now (``flush``)
        self._messages_version = messages_version
        self._peers = peers
        self._history = history
        self._arrived: dict[str, asyncio.Event] = {}
        self._cache = cache
        self._own = own
        self._on_use = on_use
        self._engine = engine
        self._lookup = lookup
        self._clock = clock
        self._executor = executor
        self._max_leases = max_leases
        self._queues: dict[str, list[_Pending]] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._listeners: list[Listener] = []
        self.rounds = 0  # rounds run (a test compares them with the calls)
        self.calls = 0

    def listen(self, fn: Listener) -> None:
        self._listeners.append(fn)

    async def lease(self, subscription: str, max_messages: int, lease_seconds: float | None, *, source: object = None) -> Granted:
        """`source`: the asking stream (``peers``)."""
        answer = await self._submit(subscription, LeaseAsk(max_messages, lease_seconds), source=source)
        assert isinstance(answer, Granted)
        return answer

    async def acknowledge(
        self, subscription: str, ids: Sequence[ackid.AckId], *, want_results: bool = False, results_if_exactly_once: bool = False,
        source: object = None,
    ) -> list[IdResult] | None:
        """Ack `ids`; a result per id with `want_results`, or with `results_if_exactly_once`
        when the subscription is exactly-once (else None). `source`: the stream the ids
        were leased to (``peers``)."""
        return await self._outcome(subscription, ids, None, want_results, results_if_exactly_once, source)

    async def modify_deadline(
        self, subscription: str, ids: Sequence[ackid.AckId], seconds: float, *, want_results: bool = False,
        results_if_exactly_once: bool = False,
    ) -> list[IdResult] | None:
        """Change the deadlines of `ids` (0: nack); results as ``acknowledge``."""
        return await self._outcome(subscription, ids, max(0.0, float(seconds)), want_results, results_if_exactly_once)

    def submit_modify_deadline(
        self, subscription: str, ids: Sequence[ackid.AckId], seconds: float, *, defer: bool = False
    ) -> asyncio.Future[Answer]:
        """Queue a deadline change now (its place in arrival order is taken at this call)
        and return the future of its round's answer (None), for a caller that answers its
        own client before the round commits. `ids` must not be empty.

        `defer` (only for a change that never ends a lease earlier than its committed end,
        ``StreamHub.modify_deadline``): it starts no round; it rides in the subscription's
        next round with other outcomes (the client's acks follow its receipt modacks within
        moments; ``_take``), or starts one after DEFER_SECONDS. Its leases end `seconds` after this call, not after the
        round (so never earlier than the client was told). Why (measured, subscribe() at 500
        msg/s): each delivered batch's receipt modack made a MERGE round of its own between
        the lease round and the acks' round, a third of the rounds."""
        secs = max(0.0, float(seconds))
        for fn in self._listeners:
            fn(ids, secs)
        deferred = defer and secs > 0
        until = self._clock() + secs if deferred else None
        return self._submit(subscription, OutcomeAsk(tuple(ids), secs, False), until, deferred=deferred)

    def submit_acknowledge(self, subscription: str, ids: Sequence[ackid.AckId]) -> asyncio.Future[Answer]:
        """Queue an ack deferred as ``submit_modify_deadline``'s `defer` is (its caller has
        made it durable already: ``server.ack_journal``) and return the future of its
        round's answer (None). `ids` must not be empty."""
        for fn in self._listeners:
            fn(ids, None)
        fut = self._submit(subscription, OutcomeAsk(tuple(ids), None, False), deferred=True)
        # Until its future is done (committed, or failed: a caller re-queueing a failed ack
        # does so from its own callback, which runs after this one with nothing in between),
        # no round of this server leases these messages again (``_acked_later``).
        pending = self._deferred_acks.setdefault(subscription, {})
        pending[fut] = tuple(i.message_id for i in ids)
        fut.add_done_callback(lambda _: pending.pop(fut, None))
        return fut

    async def flush(self, subscription: str | None = None) -> None:
        """Commit every deferred change queued now (and every other outcome), at once: of
        every subscription for a server stopping cleanly (a lease ask queued now or during
        the flush then fails with ``Cancelled``: its stream is ending), or of `subscription`
        before reading its state (CreateSnapshot), which raises the error of a round that left
        any of its deferred acks uncommitted (that caller must not read, and may retry).
        Returns when their drains have ended."""
        if subscription is not None:
            waiting = set(self._deferred_acks.get(subscription, ()))  # queued, or in a round now
            if not waiting:
                return
            self._forced.add(subscription)
            try:
                self._start(subscription, deferred_too=True)
                await asyncio.wait(waiting)
            finally:
                self._forced.discard(subscription)
            for f in waiting:  # a round that failed left its acks uncommitted: the caller must not read as if
                exc = None if f.cancelled() else f.exception()
                if f.cancelled() or (exc is not None and not ack_moot(exc)):
                    raise exc if exc is not None else Cancelled("deferred acks were cancelled")
            return
        self._flushing = True
        try:
            while True:
                for name in [n for n, q in self._queues.items() if q]:
                    self._start(name, deferred_too=True)
                running = list(self._running.values())
                if not running:
                    return
                await asyncio.wait(running)
        finally:
            self._flushing = False

    async def _outcome(
        self, subscription: str, ids: Sequence[ackid.AckId], seconds: float | None, want: bool, if_exactly_once: bool = False,
        source: object = None,
    ) -> list[IdResult] | None:
        if not ids:
            return [] if want else None
        for fn in self._listeners:
            fn(ids, seconds)
        answer = await self._submit(subscription, OutcomeAsk(tuple(ids), seconds, want, if_exactly_once), source=source)
        assert answer is None or isinstance(answer, list)
        return answer

    def _submit(
        self, subscription: str, ask: Ask, until: float | None = None, source: object = None, *, deferred: bool = False,
    ) -> asyncio.Future[Answer]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Answer] = loop.create_future()
        self._queues.setdefault(subscription, []).append(_Pending(ask, fut, until, source, deferred, loop.time()))
        self.calls += 1
        arrived = self._arrived.get(subscription)
        if arrived is not None:
            arrived.set()
        self._start(subscription)
        return fut

    def _start(self, subscription: str, *, deferred_too: bool = False) -> None:
        """Start the subscription's drain unless one runs: at once when a call that is not
        deferred waits (or `deferred_too`, or a deferred one waited `defer_seconds`), else
        when the oldest deferred one will have. A timer armed earlier is left to fire (and
        find a drain running, or nothing): cancelling it whenever another call started a
        drain let a stream's steady lease asks hold deferred acks back indefinitely."""
        if subscription in self._running:
            return
        queue = self._queues.get(subscription)
        if not queue:
            return
        loop = asyncio.get_running_loop()
        if deferred_too or any(not p.deferred for p in queue) or self._overdue(subscription, queue):
            self._running[subscription] = loop.create_task(self._drain(subscription))
        elif subscription not in self._timers:
            wait = self._defer_seconds - (loop.time() - min(p.since for p in queue))
            self._timers[subscription] = loop.call_later(max(0.0, wait), self._due, subscription)

    def _overdue(self, subscription: str, queue: Sequence[_Pending]) -> bool:
        """A deferred call of `queue` waited `defer_seconds` (or the commits are flushing)."""
        if self._flushing or subscription in self._forced:
            return True
        now = asyncio.get_running_loop().time()
        return any(p.deferred and now - p.since >= self._defer_seconds for p in queue)

    def _due(self, subscription: str) -> None:
        self._timers.pop(subscription, None)
        self._start(subscription)  # (a deferred call queued since waits its own time: the timer is armed again)

    async def _drain(self, subscription: str) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(JOIN_YIELDS):
            await asyncio.sleep(0)
        try:
            first = True
            while self._queues.get(subscription):
                queue = self._queues[subscription]
                if not first and all(p.deferred for p in queue) and not self._overdue(subscription, queue):
                    break  # only deferred changes: they wait for the next round (_start arms the timer)
                first = False
                await self._linger(subscription)
                batch = self._take(subscription)
                batch = [p for p in batch if not p.future.cancelled()] or []
                if not batch:
                    continue
                self.rounds += 1

                def early(found: dict[int, Answer], batch: list[_Pending] = batch) -> None:
                    loop.call_soon_threadsafe(settle, [batch[i] for i in found], list(found.values()))

                try:
                    answers = await run_off_loop(self._executor, self._round, subscription, self._asks(batch), early,
                                                 self._acked_later(subscription))
                except Exception as exc:  # every call of the round gets the round's error
                    fail_all(batch, exc)
                    continue
                settle(batch, answers)  # a FailedPrecondition answer (a push subscription) fails its caller alone
        finally:
            self._running.pop(subscription, None)
            self._start(subscription)  # raced in after the loop test, or deferred changes left

    async def _linger(self, subscription: str) -> None:
        """Wait (at most PEER_LINGER) while the queue has outcomes but not yet one from
        every source `peers` expects (the module constant says why)."""
        if self._peers is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + PEER_LINGER
        waited = False
        while True:
            queue = self._queues.get(subscription) or []
            sources = {p.source for p in queue if isinstance(p.ask, OutcomeAsk) and not p.deferred and p.source is not None}
            big = any(isinstance(p.ask, OutcomeAsk) and p.source is not None and len(p.ask.ids) >= PEER_LINGER_IDS for p in queue)
            if not sources or not big or any(isinstance(p.ask, LeaseAsk) and p.source not in sources for p in queue):
                return  # (a stream asking for messages without an ack of its own queued: it waits for no one)
            missing = self._peers(subscription) - sources
            left = end - loop.time()
            if not missing or left <= 0:
                if waited:  # the stream the last ack freed room on queues its lease ask (JOIN_YIELDS)
                    for _ in range(JOIN_YIELDS):
                        await asyncio.sleep(0)
                return
            waited = True
            arrived = self._arrived.setdefault(subscription, asyncio.Event())
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), left)
            except asyncio.TimeoutError:
                return
            finally:
                self._arrived.pop(subscription, None)

    def _take(self, subscription: str) -> list[_Pending]:
        """The next round's calls: every queued one, except that deferred deadline changes
        stay queued when nothing else of the round is an outcome (only lease asks). They
        then ride in the next round with an ack, nack or other change (a MERGE anyway), or
        start one after DEFER_SECONDS; most are superseded there by their message's ack
        (``resolve``: an ack wins) and cost nothing. Why (measured, bench/server.py's
        latency phase, 1 client at 500 msg/s): a deferred receipt modack riding in a round
        of new messages turned that round's append into an append plus a MERGE of the
        modacks alone (~25 ms of CPU each): 91 MERGEs in an 8 s phase before, 67 after, and
        publish -> callback p50 0.52 s -> 0.22 s, p99 1.94 s -> 0.51 s."""
        queue = self._queues.pop(subscription)
        if self._flushing:  # stopping: outcomes commit; a lease now would go to a stream that is ending
            for p in queue:
                if isinstance(p.ask, LeaseAsk) and not p.future.done():
                    p.future.set_exception(Cancelled("the server is stopping; reconnect"))
            return [p for p in queue if not isinstance(p.ask, LeaseAsk)]
        if self._overdue(subscription, queue):
            return queue  # a deferred change waited its longest: it goes now, whatever else is queued
        deferred = [p for p in queue if p.deferred]
        if not deferred or len(deferred) == len(queue) or any(isinstance(p.ask, OutcomeAsk) and not p.deferred for p in queue):
            return queue
        self._queues[subscription] = deferred  # (in arrival order, ahead of any call queued from now on)
        return [p for p in queue if not p.deferred]

    def _asks(self, batch: Sequence[_Pending]) -> list[Ask]:
        """The round's asks; a deferred change's seconds count from now (never below 1 ms:
        0 would be a nack), so its leases end no earlier than when it was asked."""
        now = self._clock()
        return [p.ask if p.until is None or not isinstance(p.ask, OutcomeAsk)
                else p.ask._replace(seconds=max(0.001, p.until - now)) for p in batch]

    def _acked_later(self, subscription: str) -> frozenset[str]:
        """The message ids of deferred acks not yet committed (queued, in a round, or failed
        and about to be queued again): no round may lease them again, even where their
        leases ran out."""
        return frozenset(m for ids in self._deferred_acks.get(subscription, {}).values() for m in ids)

    def _round(
        self, subscription: str, asks: list[Ask], early: EarlyAnswers | None = None, held: frozenset[str] = frozenset(),
    ) -> list[Answer]:
        sub = self._lookup(subscription)
        answers = run_round(self._engine, sub, asks, self._clock, max_leases=self._max_leases, cache=self._cache, early=early,
                            own=self._own, history=self._history, messages_version=self._messages_version, held=held)
        if self._on_use is not None:
            self._on_use(sub)
        return answers
