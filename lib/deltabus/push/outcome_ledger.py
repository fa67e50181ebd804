"""The push job's book of its subscriptions between micro-batches (driver memory, no I/O).

``OutcomeLedger`` keeps one ``SubState`` per push subscription (backoff, push window,
counters, recent failure reasons, the message ids in flight) and the acks and nacks not
yet committed. Its contract:

* ``fold`` takes what the workers reported since the last batch (``PushLedger.collect``):
  pushes that got no outcome leave the in-flight set (their leases expire in Delta); each
  subscription's outcomes move its backoff and window, one line is logged when its backoff
  starts, moves a lot, changes cause or ends, and its acks and nacks are *held*;
* held outcomes accumulate over batches whose commit is deferred (``CommitPacer``) and are
  handed over once, by ``take_held``, to the commit that merges them;
* ``exclusions`` is what a subscription's lease selection must skip: ids in flight and ids
  whose outcome is being merged in this very commit;
* ``pushed`` records the pushes handed to the workers; ``settle`` ends, by time, the
  backoff of a subscription that has nothing in flight (it gets no more rounds).

Not thread-safe, and need not be: only the job's thread touches it (the pool's HTTP server
thread only touches the ``PushLedger``). Log lines name the subscription and a
scheme://host:port/path form of its endpoint; never a payload, a token or a query string.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..registry import SubscriptionRecord
from .ledger import Collected
from .outcome import ACK, EXPIRED
from .state import Round, SubState, reason_of, safe_endpoint

log = logging.getLogger("deltabus.deliver")


# What a held outcome keeps: its delivery, and what the push got (the delivery history's
# status and latency, ``delivery/history.for_push``).
HELD_COLUMNS = ["message_id", "delivery_attempt", "outcome", "status", "error", "latency_seconds"]


class HeldOutcomes(NamedTuple):
    """One subscription's outcomes waiting for a commit: tables of HELD_COLUMNS (message_id,
    delivery_attempt, then the push's outcome, HTTP status, error class and latency)."""

    acks: pa.Table
    nacks: pa.Table


class Folded(NamedTuple):
    """How many outcomes one ``fold`` took in (all subscriptions)."""

    acked: int = 0
    nacked: int = 0


def failure_reasons(failed: pa.Table) -> tuple[tuple[str, int], ...]:
    """Failure reason -> count over a subscription's failed outcomes (RESULT_SCHEMA rows)."""
    if failed.num_rows == 0:
        return ()
    counts: dict[str, int] = {}
    grouped = failed.group_by(["outcome", "status", "error"]).aggregate([("message_id", "count")])
    columns = (grouped[c].to_pylist() for c in ("outcome", "status", "error", "message_id_count"))
    for outcome, status, error, n in zip(*columns):
        reason = reason_of(outcome, status, error)
        counts[reason] = counts.get(reason, 0) + n
    return tuple(counts.items())


def last_status(rows: pa.Table) -> str | None:
    """``reason_of`` the last of a subscription's outcomes (acks included); None when none."""
    if rows.num_rows == 0:
        return None
    i = rows.num_rows - 1
    return reason_of(rows["outcome"][i].as_py(), rows["status"][i].as_py(), rows["error"][i].as_py())


def round_of(rows: pa.Table) -> tuple[Round, HeldOutcomes]:
    """One subscription's reported outcomes (RESULT_SCHEMA rows) as a backoff/window round,
    and its acks and nacks to merge (every outcome but ``ack`` is a nack)."""
    is_ack = pc.equal(rows["outcome"], ACK)
    acks = rows.filter(is_ack).select(HELD_COLUMNS)
    failed = rows.filter(pc.invert(is_ack))
    nacks = failed.select(HELD_COLUMNS)
    latency = pc.sum(rows["latency_seconds"]).as_py() or 0.0
    expired = int(pc.sum(pc.cast(pc.equal(failed["outcome"], EXPIRED), pa.int64())).as_py() or 0)
    r = Round(acks.num_rows, nacks.num_rows, latency, failure_reasons(failed), last_status(rows), expired)
    return r, HeldOutcomes(acks, nacks)


class OutcomeLedger:
    """Per-subscription push state and the outcomes held for the next commit (see the module)."""

    def __init__(
        self,
        records: Callable[[], Mapping[str, SubscriptionRecord]],
        *,
        clock: Callable[[], float],
        rand: Callable[[], float],
    ) -> None:
        """`records`: the current subscriptions by name (to name them in log lines)."""
        self._records = records
        self._clock = clock
        self._rand = rand
        self._states: dict[str, SubState] = {}
        self._held: dict[str, HeldOutcomes] = {}

    # -- state ------------------------------------------------------------------------
    def state(self, sub_uid: str) -> SubState:
        """The subscription's state, created empty on first use."""
        st = self._states.get(sub_uid)
        if st is None:
            st = self._states[sub_uid] = SubState()
        return st

    def __contains__(self, sub_uid: object) -> bool:
        return sub_uid in self._states

    def restore(self, backlog_rows: Iterable[Mapping[str, Any]], uid_of: Mapping[str, str]) -> None:
        """Pick up counters, windows and backoff where the last run left them: `backlog_rows`
        are the backlog table's rows, `uid_of` maps a subscription name to its uid (rows of
        deleted subscriptions, or without push figures, are skipped)."""
        for r in backlog_rows:
            uid = uid_of.get(r["subscription"])
            if uid is None or r.get("delivered") is None:
                continue
            until = r.get("backoff_until")
            self._states[uid] = SubState().restored(
                r["delivered"] or 0, r["acked"] or 0, r["nacked"] or 0, r["push_window"] or 3, r["backoff_seconds"] or 0.0,
                backoff_until=until.timestamp() if until is not None else 0.0,
                last_status=r.get("last_status"), last_error=r.get("last_error"),
            )

    # -- outcomes ---------------------------------------------------------------------
    def fold(self, got: Collected | None) -> Folded:
        """Fold in what the workers reported (None: no workers yet); hold the acks and nacks."""
        if got is None:
            return Folded()
        if got.lost:
            for uid, mid in got.lost:
                self.state(uid).in_flight.discard(mid)
            log.error("%d pushes got no outcome (a worker failed or they waited past their deadline); "
                      "their leases expire and they are redelivered", len(got.lost))
        outcomes = got.outcomes
        if outcomes.num_rows == 0:
            return Folded()
        now = self._clock()
        acked = nacked = 0
        for uid in pc.unique(outcomes["sub_uid"]).to_pylist():
            rows = outcomes.filter(pc.equal(outcomes["sub_uid"], uid))
            st = self.state(uid)
            st.in_flight.difference_update(rows["message_id"].to_pylist())
            r, held = round_of(rows)
            self._log_backoff(uid, st.apply(r, now, self._rand()))
            self._hold(uid, held)
            acked += held.acks.num_rows
            nacked += held.nacks.num_rows
        return Folded(acked, nacked)

    def _hold(self, uid: str, new: HeldOutcomes) -> None:
        """Keep outcomes until the next commit (several batches' worth when commits are paced)."""
        old = self._held.get(uid)
        if old is not None:
            new = HeldOutcomes(pa.concat_tables([old.acks, new.acks]), pa.concat_tables([old.nacks, new.nacks]))
        self._held[uid] = new

    def take_held(self, existing: Iterable[str]) -> dict[str, HeldOutcomes]:
        """Every held outcome, for the commit about to run; none is held afterwards. Outcomes
        of subscriptions not in `existing` (deleted meanwhile) are dropped: nothing is left to
        merge them into."""
        held, self._held = self._held, {}
        keep = set(existing)
        return {u: o for u, o in held.items() if u in keep}

    def exclusions(self, sub_uid: str, merging: Mapping[str, HeldOutcomes]) -> frozenset[str]:
        """Ids a lease selection must skip: in flight, or with an outcome in `merging`."""
        exclude = set(self.state(sub_uid).in_flight)
        if sub_uid in merging:
            exclude.update(merging[sub_uid].acks["message_id"].to_pylist())
            exclude.update(merging[sub_uid].nacks["message_id"].to_pylist())
        return frozenset(exclude)

    def room(self, sub_uid: str, now: float, budget: int) -> int:
        """Leases the subscription may take now, at most `budget`: its window's room, or 0
        while in backoff."""
        st = self.state(sub_uid)
        if budget <= 0 or not st.backoff.may_push(now):
            return 0
        return min(st.window.room(len(st.in_flight)), budget)

    # -- pushes -----------------------------------------------------------------------
    def pushed(self, sub_uid: str, message_ids: Iterable[str], at: float) -> None:
        """These pushes went to the workers (leased at `at`): in flight until an outcome."""
        st = self.state(sub_uid)
        ids = list(message_ids)
        st.in_flight.update(ids)
        st.last_push = at
        st.delivered += len(ids)

    def settle(self, subs: Mapping[str, SubscriptionRecord]) -> None:
        """After a commit's leases: end by time the backoff of subscriptions (by uid) with
        nothing in flight, logging what changed."""
        now = self._clock()
        for uid in subs:
            st = self._states.get(uid)
            if st is not None:
                self._log_backoff(uid, st.settle(now), subs)

    def _log_backoff(self, uid: str, line: str | None, by_uid: Mapping[str, SubscriptionRecord] | None = None) -> None:
        """One line about a subscription's backoff: its name and endpoint (scheme://host:port/path
        only: a query may hold a secret), the delay, nack counts and top failure reasons."""
        if line is None:
            return
        recs = by_uid if by_uid is not None else {r.sub_uid: r for r in self._records().values()}
        rec = recs.get(uid)
        if rec is None:
            return
        where = f"push to {rec.name} ({safe_endpoint(rec.push_config.push_endpoint)})"
        (log.info if line.startswith("recovered") else log.warning)("%s: %s", where, line)
