"""The push delivery job: a structured-streaming query over the messages table.

Every micro-batch (``DeliveryJob.on_batch``, the foreachBatch handler):

1. folds in the outcomes the push workers reported since the last batch: each
   subscription's backoff and push window move, and its acks and nacks are held for
   the commit. While the workers have plenty queued, the commit waits for a later batch
   (at most ``CommitPacing.max_interval`` seconds; ``policy/pacing.py``);
2. commits ONE MERGE into ``deliveries`` (``plan.execute``) that fans the batch's new
   messages out to every push subscription of their topic (each from its own cursor,
   so the subscription point holds), applies the queued acks (delete) and nacks, and
   leases what is due (new, nacked, or past its ack deadline) within each window and
   outside backoff. The commit carries the application transaction (job, batch id): a
   batch Spark replays after a crash is recognised and skipped;
3. queues the new leases' requests for the push workers: long-lived tasks on the
   executors (``pool.PushPool``) that POST them and report each outcome back, to be
   folded in by a later batch. Each worker caps what it holds per subscription, so a
   slow endpoint (an ack deadline of up to 600 s) never holds back other subscriptions;
4. rewrites the ``backlog`` table every ``backlog_interval`` seconds.

Leases are committed before anything is pushed: if the job dies at any point, the
leased messages come back when their deadline passes. No acked message is pushed
again on purpose and no unacked message is lost.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from .. import backlog as backlog_mod
from ..config import Settings
from ..leasing import _us, read_payloads
from ..policy.pacing import CommitPacing, rate_after
from ..registry import Registry, SubscriptionRecord
from ..storage import Engine, open_engine
from ..storage.tables import BACKLOG, DELIVERIES
from ..validation import endpoint_scheme
from . import plan
from .auth import SigningKey, TokenSource
from .pool import PushPool
from .sender import REQUEST_SCHEMA
from .state import Round, SubState, reason_of, safe_endpoint

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("deltabus.deliver")

@dataclass(slots=True)
class BatchReport:
    batch_id: int | None
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    fanned_out: int = 0
    backlog: int | None = None
    push_subscriptions: int = 0
    skipped: bool = False
    deferred: int | None = None  # not committed: this many pushes were queued for the workers
    seconds: float = 0.0

    def line(self) -> str:
        if self.skipped:
            return f"batch {self.batch_id}: already committed before a restart; skipped"
        if self.deferred is not None:
            return (
                f"batch {self.batch_id}: acked {self.acked} nacked {self.nacked}, held for the next commit "
                f"({self.deferred} pushes queued for the workers) in {self.seconds:.2f}s"
            )
        backlog = "?" if self.backlog is None else str(self.backlog)
        return (
            f"batch {self.batch_id}: delivered {self.delivered} acked {self.acked} nacked {self.nacked} "
            f"backlog {backlog} ({self.push_subscriptions} push subscriptions, {self.fanned_out} fanned out) "
            f"in {self.seconds:.2f}s"
        )


@dataclass(slots=True)
class RunSummary:
    batches: int = 0
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    stopped_because: str = ""
    reports: list[BatchReport] = field(default_factory=list)


# At most this share of the job's time goes to refreshing the backlog table.
BACKLOG_DUTY = 10.0  # refresh at most every 10x the last refresh's duration

# When the job stops, pushes already handed to workers get this long past their deadline to report.
DRAIN_GRACE = 5.0


def _reasons(failed: pa.Table) -> tuple[tuple[str, int], ...]:
    """Failure reason -> count over a subscription's failed outcomes (RESULT_SCHEMA rows)."""
    if failed.num_rows == 0:
        return ()
    counts: dict[str, int] = {}
    grouped = failed.group_by(["outcome", "status", "error"]).aggregate([("message_id", "count")])
    for outcome, status, error, n in zip(*(grouped[c].to_pylist() for c in ("outcome", "status", "error", "message_id_count"))):
        reason = reason_of(outcome, status, error)
        counts[reason] = counts.get(reason, 0) + n
    return tuple(counts.items())


def _last_status(rows: pa.Table) -> str | None:
    if rows.num_rows == 0:
        return None
    i = rows.num_rows - 1
    return reason_of(rows["outcome"][i].as_py(), rows["status"][i].as_py(), rows["error"][i].as_py())


def endpoint_allowed(sub: SubscriptionRecord, allow_http: bool) -> bool:
    endpoint = sub.push_config.push_endpoint
    scheme = endpoint_scheme(endpoint)
    return scheme == "https" or (allow_http and scheme == "http")


class DeliveryJob:
    def __init__(
        self,
        spark: "SparkSession",
        settings: Settings,
        *,
        engine: Engine | None = None,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
        until_idle: bool = False,
        pacing: CommitPacing = CommitPacing(),
    ) -> None:
        self.spark = spark
        self.settings = settings
        # A mistyped --warehouse is an error, not a new empty warehouse to watch forever.
        self.engine = engine or open_engine(settings.warehouse, engine=settings.engine, spark=spark, create=False)
        self.registry = Registry(self.engine, clock=clock)
        self._clock = clock
        self._rand = rand
        self._states: dict[str, SubState] = {}
        self._pool: PushPool | None = None  # started with the first pushes
        self.pacing = pacing
        self._held_outcomes: dict[str, tuple[pa.Table, pa.Table]] = {}  # sub_uid -> (acks, nacks) not yet committed
        self._send_rate = 0.0  # outcomes per second, smoothed
        self._last_rate_at = clock()
        self._last_commit = float("-inf")
        self._tokens: TokenSource | None = None
        self._key_lock = threading.Lock()
        self._last_backlog = 0.0
        self._backlog_total: int | None = None
        self._backlog_fresh = False
        self._backlog_cost = 0.0  # seconds the last backlog refresh took
        self._warned: set[str] = set()
        # Each engine streams from its own source, so each keeps its own checkpoint (and batch ids).
        suffix = "" if self.engine.name == "delta-rs" else f"-{self.engine.name}"
        self.checkpoint = f"{settings.checkpoint_path.rstrip('/')}/deliver{suffix}"
        self.app_id = "deltabus-deliver-" + hashlib.sha256(self.checkpoint.encode()).hexdigest()[:16]
        self.idle = False
        self.stopping = False
        self._drain_limits: tuple[float | None, threading.Event | None] = (None, None)
        self.until_idle = until_idle
        self.summary = RunSummary()
        self._restore()

    # -- state ------------------------------------------------------------------------
    def _restore(self) -> None:
        """Pick up counters, windows and backoff where the last run left them."""
        rows = self.engine.snapshot(BACKLOG.name).read().to_pylist()
        subs = {s.name: s.sub_uid for s in self.registry.subscriptions().values()}
        for r in rows:
            uid = subs.get(r["subscription"])
            if uid is None or r.get("delivered") is None:
                continue
            until = r.get("backoff_until")
            self._states[uid] = SubState().restored(
                r["delivered"] or 0, r["acked"] or 0, r["nacked"] or 0, r["push_window"] or 3, r["backoff_seconds"] or 0.0,
                backoff_until=until.timestamp() if until is not None else 0.0,
                last_status=r.get("last_status"), last_error=r.get("last_error"),
            )

    def state(self, sub_uid: str) -> SubState:
        st = self._states.get(sub_uid)
        if st is None:
            st = self._states[sub_uid] = SubState()
        return st

    def tokens(self) -> TokenSource:
        """The signing key is created (0600) on first use."""
        with self._key_lock:
            if self._tokens is None:
                self._tokens = TokenSource(SigningKey(self.settings.keys_path), issuer=self.settings.issuer, clock=self._clock)
            return self._tokens

    def push_subscriptions(self, records: Mapping[str, SubscriptionRecord] | None = None) -> dict[str, SubscriptionRecord]:
        """The push subscriptions this job may push to, from `records` (default: the registry)."""
        out = {}
        for rec in (records if records is not None else self.registry.subscriptions()).values():
            if not rec.push_config.is_push:
                continue
            if not endpoint_allowed(rec, self.settings.allow_http):
                if rec.name not in self._warned:
                    log.warning("not pushing to %s: its endpoint is not https and allow_http is off", rec.name)
                    self._warned.add(rec.name)
                continue
            out[rec.sub_uid] = rec
        return out

    # -- outcomes ---------------------------------------------------------------------
    def _collect(self, wait: bool = False) -> dict[str, tuple[pa.Table, pa.Table]]:
        """Fold the outcomes the push workers reported; return sub_uid -> (acks, nacks) to merge.

        With `wait` (the job is stopping), first wait for what the workers hold, up to the
        longest ack deadline: after that their leases have expired anyway."""
        if self._pool is None:
            return {}
        if wait:
            within, hurry = self._drain_limits
            # Nothing more is leased; what is leased is still pushed. A push's request times out
            # at its ack deadline and a request still waiting at the end of its lease is not
            # sent, so after the longest deadline in flight (plus a grace for reporting) every
            # push has an outcome. `within` caps that wait; `hurry` ends it.
            longest = max((r.ack_deadline_seconds for r in self.registry.subscriptions().values()
                           if self._states.get(r.sub_uid) and self._states[r.sub_uid].in_flight), default=0)
            bound = longest + DRAIN_GRACE if within is None else min(within, longest + DRAIN_GRACE)
            if not self._pool.wait_settled(bound, cancel=hurry):
                self._pool.stop_handing_out()
                log.info("stopped waiting for %d pushes in flight; their leases expire and they are redelivered",
                         self._pool.outstanding())
        got = self._pool.collect()
        if got.lost:
            for uid, mid in got.lost:
                self.state(uid).in_flight.discard(mid)
            log.error("%d pushes got no outcome (a worker failed or they waited past their deadline); "
                      "their leases expire and they are redelivered", len(got.lost))
        outcomes = got.outcomes
        if outcomes.num_rows == 0:
            return {}
        now = self._clock()
        result: dict[str, tuple[pa.Table, pa.Table]] = {}
        for uid in pc.unique(outcomes["sub_uid"]).to_pylist():
            rows = outcomes.filter(pc.equal(outcomes["sub_uid"], uid))
            st = self.state(uid)
            st.in_flight.difference_update(rows["message_id"].to_pylist())
            is_ack = pc.equal(rows["outcome"], "ack")
            acks = rows.filter(is_ack).select(["message_id", "delivery_attempt"])
            failed = rows.filter(pc.invert(is_ack))
            nacks = failed.select(["message_id", "delivery_attempt"])
            latency = pc.sum(rows["latency_seconds"]).as_py() or 0.0
            expired = int(pc.sum(pc.cast(pc.equal(failed["outcome"], "expired"), pa.int64())).as_py() or 0)
            line = st.apply(
                Round(acks.num_rows, nacks.num_rows, latency, _reasons(failed), _last_status(rows), expired), now, self._rand()
            )
            self._log_backoff(uid, line)
            result[uid] = (acks, nacks)
        return result

    def _log_backoff(self, uid: str, line: str | None, records: Mapping[str, SubscriptionRecord] | None = None) -> None:
        """One line about a subscription's backoff: its name and endpoint (scheme://host:port/path
        only: a query may hold a secret), the delay, nack counts and top failure reasons."""
        if line is None:
            return
        recs = records if records is not None else {r.sub_uid: r for r in self.registry.subscriptions().values()}
        rec = recs.get(uid)
        if rec is None:
            return
        where = f"push to {rec.name} ({safe_endpoint(rec.push_config.push_endpoint)})"
        (log.info if line.startswith("recovered") else log.warning)("%s: %s", where, line)

    def _settle_backoffs(self, subs: Mapping[str, SubscriptionRecord]) -> None:
        now = self._clock()
        for uid in subs:
            st = self._states.get(uid)
            if st is not None:
                self._log_backoff(uid, st.settle(now), subs)

    # -- the micro-batch --------------------------------------------------------------
    def on_batch(self, df: "DataFrame", batch_id: int) -> None:
        """foreachBatch handler. Once stopping, batches are no-ops so the query stops at once:
        fan-out follows each subscription's own cursor, so a skipped batch is caught up later."""
        if self.stopping:
            return
        if self.engine.name == "delta-spark":
            # The Delta stream only paces batches; fan-out reads whole versions from the change
            # feed (a Delta micro-batch may end inside a version).
            self.process(None, batch_id)
            return
        # Lazily: a batch whose commit is deferred never collects its rows (a Spark job).
        self.process(df.toArrow, batch_id)

    def process(self, batch: pa.Table | Callable[[], pa.Table] | None, batch_id: int | None) -> BatchReport:
        """One micro-batch: `batch` is its rows (or a function returning them, called only if
        this batch commits), None when it carries no rows; `batch_id` None when draining."""
        started = time.monotonic()
        report = BatchReport(batch_id)
        deliveries = self.engine.snapshot(DELIVERIES.name)
        if batch_id is not None:
            done = deliveries.txn_version(self.app_id)
            if done is not None and done >= batch_id:
                report.skipped = True
                log.info(report.line())
                return report

        collected = self._collect(wait=batch_id is None)
        report.acked = sum(a.num_rows for a, _ in collected.values())
        report.nacked = sum(n.num_rows for _, n in collected.values())
        self._hold(collected)
        now = self._clock()
        self._send_rate = rate_after(self._send_rate, report.acked + report.nacked, now - self._last_rate_at)
        self._last_rate_at = now
        queued = self._pool.queued() if self._pool is not None else 0
        if batch_id is not None and not self.pacing.due(now, self._last_commit, queued=queued, send_rate=self._send_rate):
            # The workers hold plenty: this batch's outcomes wait for the next commit, and its
            # messages are fanned out from the subscriptions' cursors then.
            report.deferred = queued
            report.seconds = time.monotonic() - started
            self._count(report)
            log.info(report.line())
            return report
        self._last_commit = now
        outcomes, self._held_outcomes = self._held_outcomes, {}
        if callable(batch):
            batch = batch()
        if batch is None or batch.num_rows == 0:
            first = last = self.engine.version("messages")
            batch = pa.table({"topic_uid": pa.array([], pa.string()), "message_id": pa.array([], pa.string()),
                              "publish_time": pa.array([], pa.timestamp("us", tz="UTC")), "ordering_key": pa.array([], pa.string()),
                              "size_bytes": pa.array([], pa.int64()), "version": pa.array([], pa.int64())})
        else:
            first = int(pc.min(batch["range_start"]).as_py())
            last = int(pc.max(batch["range_end"]).as_py())
            batch = batch.filter(pc.is_valid(batch["message_id"]))

        records = self.registry.subscriptions()
        subs = self.push_subscriptions(records)
        report.push_subscriptions = len(subs)
        # Outcomes of subscriptions deleted meanwhile have nothing left to merge into.
        existing = {s.sub_uid for s in records.values()}
        outcomes = {u: o for u, o in outcomes.items() if u in existing}

        budget = self.settings.max_pushes_per_batch if batch_id is not None else 0

        def attempt(snap: Any) -> plan.PlanResult:
            now = self._clock()
            remaining = budget
            plans = []
            for uid, rec in subs.items():
                st = self.state(uid)
                room = 0
                if remaining > 0 and st.backoff.may_push(now):
                    room = min(st.window.room(len(st.in_flight)), remaining)
                    remaining -= room
                exclude = set(st.in_flight)
                if uid in outcomes:
                    exclude.update(outcomes[uid][0]["message_id"].to_pylist())
                    exclude.update(outcomes[uid][1]["message_id"].to_pylist())
                plans.append(plan.SubPlan(rec, room, frozenset(exclude)))
            return plan.execute(
                self.engine, snap, plans, outcomes, batch, first, last, now=now,
                batch_txn=(self.app_id, batch_id) if batch_id is not None else None,
            )

        result = self.engine.transact(DELIVERIES.name, attempt, what=f"push batch {batch_id}")
        report.fanned_out = result.fanned_out
        report.delivered = self._launch(subs, result.leases, result.leased_at)
        self._settle_backoffs(subs)
        quiet = (self._pool is None or self._pool.outstanding() == 0) and report.delivered == 0 and not outcomes and not result.fanned_out
        # Idleness is only ever judged on a backlog computed in this very batch.
        self._maybe_write_backlog(subs, force=batch_id is None or (quiet and self.until_idle))
        report.backlog = self._backlog_total
        report.seconds = time.monotonic() - started
        self.idle = quiet and self._backlog_fresh and self._backlog_total == 0
        self._count(report)
        log.info(report.line())
        return report

    def _count(self, report: BatchReport) -> None:
        self.summary.batches += 1
        self.summary.delivered += report.delivered
        self.summary.acked += report.acked
        self.summary.nacked += report.nacked

    def _hold(self, outcomes: dict[str, tuple[pa.Table, pa.Table]]) -> None:
        """Keep outcomes until the next commit (several batches' worth when commits are paced)."""
        for uid, (acks, nacks) in outcomes.items():
            held = self._held_outcomes.get(uid)
            if held is not None:
                acks, nacks = pa.concat_tables([held[0], acks]), pa.concat_tables([held[1], nacks])
            self._held_outcomes[uid] = (acks, nacks)

    # -- pushing ----------------------------------------------------------------------
    def _requests(self, rec: SubscriptionRecord, leases: list[tuple[str, int]], leased_at: float) -> pa.Table:
        """The push requests (REQUEST_SCHEMA) of one subscription's leases, payloads read from Delta."""
        ids = pa.array([m for m, _ in leases], pa.string())
        payloads = read_payloads(self.engine, rec.topic_uid, ids)
        at = pc.index_in(ids, value_set=payloads["message_id"])
        found = pc.is_valid(at)
        missing = len(ids) - pc.sum(found).as_py() if len(ids) else 0
        if missing:
            log.error("%d leased messages of %s have no payload; their leases will expire", missing, rec.name)
        at = at.filter(found)
        attempts = pa.array([a for _, a in leases], pa.int32()).filter(found)
        rows = payloads.take(at)
        n = rows.num_rows
        pcfg = rec.push_config
        token = None
        if pcfg.oidc_token is not None:
            token = self.tokens().token(pcfg.oidc_token.service_account_email, pcfg.oidc_token.audience or pcfg.push_endpoint)

        def same(value: Any, kind: pa.DataType) -> pa.Array:
            return pa.repeat(pa.scalar(value, kind), n)

        columns = {
            "sub_uid": same(rec.sub_uid, pa.string()),
            "subscription": same(rec.name, pa.string()),
            "message_id": rows["message_id"],
            "delivery_attempt": attempts,
            "endpoint": same(pcfg.push_endpoint, pa.string()),
            "token": same(token, pa.string()),
            "no_wrapper": same(pcfg.no_wrapper is not None, pa.bool_()),
            "write_metadata": same(bool(pcfg.no_wrapper and pcfg.no_wrapper.write_metadata), pa.bool_()),
            "timeout_seconds": same(float(rec.ack_deadline_seconds), pa.float64()),
            "data": pc.fill_null(rows["data"], b""),
            "attributes": rows["attributes"],
            "ordering_key": pc.fill_null(rows["ordering_key"], ""),
            "publish_time": rows["publish_time"],
            "lease_expires": same(_us(leased_at + rec.ack_deadline_seconds), pa.int64()),
        }
        return pa.table({k: columns[k] for k in REQUEST_SCHEMA.names}).cast(REQUEST_SCHEMA)

    def _launch(self, subs: dict[str, SubscriptionRecord], leases: dict[str, list[tuple[str, int]]], leased_at: float) -> int:
        """Queue the leases' requests for the push workers (started on first use)."""
        sent = 0
        for uid, items in leases.items():
            table = self._requests(subs[uid], items, leased_at)
            if table.num_rows == 0:
                continue
            if self._pool is None:
                self._pool = PushPool(self.spark, workers=self.settings.delivery_partitions)
            st = self.state(uid)
            st.in_flight.update(table["message_id"].to_pylist())
            st.last_push = leased_at
            st.delivered += table.num_rows
            sent += table.num_rows
            self._pool.submit(uid, table)
        return sent

    # -- backlog ----------------------------------------------------------------------
    def _maybe_write_backlog(self, push: dict[str, SubscriptionRecord], force: bool = False) -> None:
        now = self._clock()
        self._backlog_fresh = False
        # A refresh reads the delivered rows and every subscription's log statistics; refresh
        # less often when that grows, so it never takes more than a tenth of the job's time.
        interval = max(self.settings.backlog_interval, BACKLOG_DUTY * self._backlog_cost)
        if not force and now - self._last_backlog < interval:
            return
        self._backlog_fresh = True
        self._last_backlog = now
        started = time.monotonic()
        stats = []
        total = 0
        for rec in sorted(self.registry.subscriptions().values(), key=lambda r: r.name):
            b = backlog_mod.compute(self.engine, rec, now)
            if rec.sub_uid in push or rec.sub_uid in self._states:
                st = self.state(rec.sub_uid)
                b = replace(
                    b, delivered=st.delivered, acked=st.acked, nacked=st.nacked,
                    push_window=st.window.limit, backoff_seconds=st.backoff.delay,
                    backoff_until=(dt.datetime.fromtimestamp(st.backoff.paused_until, tz=dt.timezone.utc)
                                   if st.backoff.active and st.backoff.paused_until > 0 else None),
                    backoff_reason=st.backoff_reason, last_status=st.last_status, last_error=st.last_error,
                )
            if rec.sub_uid in push:
                total += b.num_unacked_messages
            stats.append(b)
        backlog_mod.write(self.engine, stats)
        self._backlog_total = total
        self._backlog_cost = time.monotonic() - started

    # -- running ----------------------------------------------------------------------
    def drain(self, within: float | None = None, hurry: threading.Event | None = None) -> BatchReport:
        """After the stream stopped: send nothing more, wait for the pushes the workers hold
        (up to `within` seconds and their longest ack deadline, or until `hurry` is set) and
        merge every outcome reported."""
        self._drain_limits = (within, hurry)
        return self.process(None, None)

    def unsettled(self) -> int:
        """Pushes queued or held by a worker whose outcome has not come back."""
        return 0 if self._pool is None else self._pool.outstanding()

    def close(self, wait: float = 15.0) -> None:
        """Stop the push workers, waiting up to `wait` seconds for them to end."""
        if self._pool is not None:
            self._pool.close(wait)
            self._pool = None
