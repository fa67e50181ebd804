"""The push delivery job: a structured-streaming query over the messages table.

Every micro-batch (``DeliveryJob.on_batch``, the foreachBatch handler; ``process``):

1. a batch Spark replays after a crash is recognised and skipped (``micro_batch``);
2. the outcomes the push workers reported since the last batch are folded in
   (``OutcomeLedger``): each subscription's backoff and push window move, and its acks and
   nacks are held for the commit. While the workers have plenty queued, the commit waits
   for a later batch (at most ``CommitPacing.max_interval`` seconds; ``CommitPacer``);
3. ONE MERGE is committed into ``deliveries`` (``plan.execute``) that fans the batch's new
   messages out to every push subscription of their topic (each from its own cursor, so
   the subscription point holds), applies the held acks (delete) and nacks, and leases
   what is due (new, nacked, or past its ack deadline) within each window and outside
   backoff. The commit carries the application transaction (job, batch id);
4. the new leases' requests (``RequestBuilder``) are queued for the push workers:
   long-lived tasks on the executors (``pool.PushPool``) that POST them and report each
   outcome back, to be folded in by a later batch. Each worker caps what it holds per
   subscription, so a slow endpoint (an ack deadline of up to 600 s) never holds back
   other subscriptions;
5. the Delta export subscriptions (issue 17, ``exporter``) lease their messages through the
   pull path, append them to their tables once and ack them; a table that cannot be
   written leaves its messages unacked and its reason in the backlog's last_status/last_error;
6. the ``backlog`` table is rewritten every ``backlog_interval`` seconds
   (``BacklogRefresher``), which also tells whether the job is idle.

A lease runs for its ack deadline plus the time the job's recent commits took, so it counts
from when its push can go out, as Pub/Sub's does; a batch that fans out a large backlog
grants none (``policy/lease_start.py``).

Leases are committed before anything is pushed: if the job dies at any point, the
leased messages come back when their deadline passes. No acked message is pushed
again on purpose and no unacked message is lost.

``process`` and ``drain`` run on one thread (Spark's foreachBatch thread, then the
runner's); the pool's threads only touch its ``PushLedger``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

import pyarrow as pa

from ..config import Settings
from ..policy.lease_start import FANOUT_LIMIT, CommitTimes
from ..policy.pacing import CommitPacing
from ..delivery import dead_letter
from ..delivery.dead_letter import DeadLetterMover
from ..delivery.hooks import hooks_for
from ..activity import ActivityRecorder
from ..registry import Registry, SubscriptionRecord
from ..errors import ClockUncertain
from ..policy.clock_skew import ClockSkewPolicy
from ..storage import Engine, Snapshot, open_engine
from ..storage.clock import StorageClock, deadline, local_deadline, resolve_clock, wall
from ..storage.tables import BACKLOG, DELIVERIES
from . import plan
from ..spark import idle_hint
from ..policy.idle_wake import WATCHED, IdleHint
from .auth import TokenSource
from .backlog_refresher import BacklogRefresher
from .commit_pacer import CommitPacer
from .exporter import DeltaExporter, ExportReport, export_budget, export_subscriptions
from .ledger import Collected
from .micro_batch import BatchRows, already_committed, app_id_for, batch_rows, checkpoint_for
from ..delivery.history import HistorySettings
from .outcome_ledger import HeldOutcomes, OutcomeLedger
from .pool import PushPool
from .request_builder import RequestBuilder
from .state import SubState
from .targets import PushTargets

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("deltabus.deliver")

# Seconds an idle job's stream may go without a batch when nothing it watches moves
# (``policy.idle_wake``): what is due by time alone (backlog figures, expiration policies)
# waits at most this long.
IDLE_RECHECK = 10.0


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
    # The most message bytes ever leased and not yet settled at once (Settings.max_queued_bytes).
    peak_push_bytes: int = 0


# When the job stops, pushes already handed to workers get this long past their deadline to report.
DRAIN_GRACE = 5.0
# Seconds a batch waits for the runner to name the streaming query (it does right after
# start(), which returns as the first batch may begin).
QUERY_BIND_TIMEOUT = 60.0


class DeliveryJob:
    def __init__(
        self,
        spark: "SparkSession",
        settings: Settings,
        *,
        engine: Engine | None = None,
        clock: Callable[[], float] | None = None,
        clock_skew: ClockSkewPolicy | None = None,
        rand: Callable[[], float] = random.random,
        until_idle: bool = False,
        pacing: CommitPacing = CommitPacing(),
    ) -> None:
        """`clock`: wall seconds, used as given; without one the job keeps the storage's time
        (``storage.clock.StorageClock`` under `clock_skew`, default ``ClockSkewPolicy()``), so
        its leases hold against pullers whose clocks are off."""
        self.spark = spark
        self.settings = settings
        # A mistyped --warehouse is an error, not a new empty warehouse to watch forever.
        self.engine = engine or open_engine(settings.warehouse, engine=settings.engine, spark=spark, create=False)
        clock = resolve_clock(clock, clock_skew)
        if isinstance(clock, StorageClock):
            clock.attach(self.engine)
        self.registry = Registry(self.engine, clock=clock)
        self.activity = ActivityRecorder(self.registry, wall(clock))  # for expiration policies
        self._clock = clock
        self.book = OutcomeLedger(self.registry.subscriptions, clock=clock, rand=rand)
        self.pacer = CommitPacer(pacing, clock())
        self.commit_times = CommitTimes()  # how long this job's commits take: leases start after them
        self._held_leases = False  # the last commit leased nothing to fan a backlog out first
        # The push subscription whose next lease did not fit the byte cap last time: served first
        # (plan.PlanResult.bytes_blocked), so the bytes freed go to it before any other.
        self._bytes_first: str | None = None
        self.requests = RequestBuilder(self.engine, keys_path=settings.keys_path, issuer=settings.issuer, clock=wall(clock))  # tokens: iat/exp
        self.backlog = BacklogRefresher(self.engine, self.registry.subscriptions, interval=settings.backlog_interval, clock=clock)
        self.targets = PushTargets(allow_http=settings.allow_http)
        self._pool: PushPool | None = None  # started with the first pushes
        self._exporter: DeltaExporter | None = None  # made with the first export subscription
        self.checkpoint = checkpoint_for(settings.checkpoint_path, self.engine.name)
        # The idle hint (policy.idle_wake), for the delta-rs stream source only; a hint left by
        # an earlier run is cleared: this run's first batches judge idleness afresh.
        self.idle_hint = idle_hint.hint_path(self.checkpoint) if self.engine.name == "delta-rs" else None
        self._hinted = False
        if self.idle_hint is not None:
            idle_hint.clear(self.idle_hint)
        self.app_id = app_id_for(self.checkpoint)  # until bind_query names the streaming query
        self._query_bound: threading.Event | None = None  # set by expect_query: batches wait for bind_query
        self.idle = False
        self.stopping = False
        self.until_idle = until_idle
        self._drain_limits: tuple[float | None, threading.Event | None] = (None, None)
        self.summary = RunSummary()
        # Not on delta-spark yet (README "Delivery history", "Engines"): its MERGE can refuse
        # some of a decision's leases (delivery/merge.py, LeasesRaced) while their insert-only
        # history rows still land, so the history could record leases that never happened.
        self.history = HistorySettings(enabled=settings.delivery_history and self.engine.name == "delta-rs")
        subs = {s.name: s.sub_uid for s in self.registry.subscriptions().values()}
        self.book.restore(self.engine.snapshot(BACKLOG.name).read().to_pylist(), subs)

    def state(self, sub_uid: str) -> SubState:
        """The job's push state for a subscription (created empty on first use)."""
        return self.book.state(sub_uid)

    def tokens(self) -> TokenSource:
        """The push tokens' source; the signing key is created (0600) on first use."""
        return self.requests.tokens()

    def push_subscriptions(self, records: Mapping[str, SubscriptionRecord] | None = None) -> dict[str, SubscriptionRecord]:
        """The push subscriptions this job may push to, by uid, from `records` (default: the registry)."""
        return self.targets.select(records if records is not None else self.registry.subscriptions())

    # -- the streaming query ------------------------------------------------------------
    def expect_query(self) -> None:
        """Call before starting the streaming query: its batches then wait for ``bind_query``."""
        self._query_bound = threading.Event()

    def bind_query(self, query_id: str) -> None:
        """The streaming query's id (``StreamingQuery.id``, kept in its checkpoint): batches are
        recorded under an application id of this checkpoint AND query (``app_id_for``)."""
        self.app_id = app_id_for(self.checkpoint, query_id)
        if self._query_bound is not None:
            self._query_bound.set()

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
        if batch_id is not None and self._query_bound is not None and not self._query_bound.wait(QUERY_BIND_TIMEOUT):
            raise RuntimeError("the streaming query's id was never bound (DeliveryJob.bind_query after start())")
        if batch_id is not None and already_committed(self.engine.snapshot(DELIVERIES.name), self.app_id, batch_id):
            report.skipped = True
            log.info(report.line())
            return report
        # The watched tables' versions before this batch reads anything (policy.idle_wake): a
        # commit landing while the batch runs (a subscription made push, a seek) must wake the
        # next trigger, so an idle hint never names a version this batch did not see.
        watched = {t: self.engine.version(t) for t in WATCHED} if self.idle_hint is not None and batch_id is not None else None
        report.acked, report.nacked = self.book.fold(self._collect(wait=batch_id is None))
        queued = self._pool.queued() if self._pool is not None else 0
        if not self.pacer.commit_now(self._clock(), settled=report.acked + report.nacked, queued=queued, forced=batch_id is None):
            # The workers hold plenty: this batch's outcomes wait for the next commit, and its
            # messages are fanned out from the subscriptions' cursors then.
            report.deferred = queued
            return self._finish(report, started)
        rows = batch_rows(batch, self.engine)
        records = self.registry.subscriptions()
        # Outcomes of subscriptions deleted or detached meanwhile have nothing left to merge into.
        merging = self.book.take_held(s.sub_uid for s in records.values() if not s.detached)
        subs = self.push_subscriptions(records)
        if self._bytes_first in subs:
            first = self._bytes_first
            subs = {first: subs[first], **{u: r for u, r in subs.items() if u != first}}
        report.push_subscriptions = len(subs)
        budget = self.settings.max_pushes_per_batch if batch_id is not None else 0
        by_uid = {rec.sub_uid: rec for rec in records.values()}
        # Dead-letter policies (issue 13): finish any unfinished move first (the batch's MERGE
        # marks new ones); only subscriptions with a policy read or write anything here.
        movers = self._dead_letter_movers(subs)
        began = time.monotonic()
        result = self.engine.transact(
            DELIVERIES.name, lambda snap: self._plan(snap, subs, merging, rows, budget, batch_id, by_uid, movers),
            what=f"push batch {batch_id}",
        )
        self._bytes_first = result.bytes_blocked
        if result.committed:
            self.commit_times.add(time.monotonic() - began)
            self._held_leases = result.held_leases
        for uid, key in result.dead_letter_keys.items():  # a crash before this: the next batch's recover finishes it
            movers[uid].finish(self.engine, key)
        report.fanned_out = result.fanned_out
        report.delivered = self._launch(subs, result.leases, result.leased_at, result.lease_expires)
        if result.committed:  # pushed or settled: the subscription is in use (expiration policies)
            for uid in {u for u, items in result.leases.items() if items} | set(merging):
                if uid in by_uid:
                    self.activity.used(by_uid[uid])
        self.book.settle(subs)
        exports = export_subscriptions(records)
        exported, export_acked = (
            self._export(exports, export_budget(budget, report.delivered)) if exports and batch_id is not None else (0, 0)
        )
        report.delivered += exported
        report.acked += export_acked
        quiet = self.unsettled() == 0 and report.delivered == 0 and not merging and not result.fanned_out
        # Idleness is only ever judged on a backlog computed in this very batch (export
        # subscriptions' backlogs count: an export that cannot write is never idle).
        self.backlog.refresh({**subs, **exports}, self.book, force=batch_id is None or (quiet and self.until_idle))
        report.backlog = self.backlog.total
        self.idle = quiet and self.backlog.nothing_left
        if batch_id is not None:
            self._hint(self.idle, watched)
        return self._finish(report, started)

    def _hint(self, idle: bool, versions: Mapping[str, int] | None) -> None:
        """Leave the idle hint after an idle batch (the watched tables' `versions` as of the
        batch's start: anything committed since wakes the next trigger), and clear it after
        any other (``policy.idle_wake``)."""
        if self.idle_hint is None:
            return
        if idle and versions is not None:
            idle_hint.write(self.idle_hint, IdleHint(versions, wall(self._clock)(), IDLE_RECHECK))
            self._hinted = True
        elif self._hinted:
            idle_hint.clear(self.idle_hint)
            self._hinted = False

    def _finish(self, report: BatchReport, started: float) -> BatchReport:
        report.seconds = time.monotonic() - started
        self.summary.batches += 1
        self.summary.delivered += report.delivered
        self.summary.acked += report.acked
        self.summary.nacked += report.nacked
        log.info(report.line())
        return report

    def _plan(
        self,
        snap: Snapshot,
        subs: Mapping[str, SubscriptionRecord],
        merging: Mapping[str, HeldOutcomes],
        rows: BatchRows,
        budget: int,
        batch_id: int | None,
        records: Mapping[str, SubscriptionRecord] | None = None,
        movers: Mapping[str, DeadLetterMover] | None = None,
    ) -> plan.PlanResult:
        """Plan and commit the batch's MERGE (run by ``engine.transact``: a conflict reruns it).
        The lease budget goes to the subscriptions in order, each up to its window's room."""
        now = self._clock()
        try:  # leases run from the storage's latest possible time (storage/clock.py)
            pad: float | None = deadline(self._clock, now, 0.0) - now
        except ClockUncertain as exc:
            log.warning("leasing nothing this batch: %s", exc)
            pad = None
        remaining = budget if pad is not None else 0
        # The push queue's byte cap (settings.max_queued_bytes): the pushes queued or with a
        # worker, not yet settled, leave the rest for this batch's leases.
        queued_bytes = self._pool.ledger.outstanding_bytes() if self._pool is not None else 0
        plans = []
        for uid, rec in subs.items():
            room = self.book.room(uid, now, remaining)
            remaining -= room
            lease = rec.ack_deadline_seconds + self.commit_times.allowance(rec.ack_deadline_seconds) + (pad or 0.0)
            plans.append(plan.SubPlan(rec, room, self.book.exclusions(uid, merging), (movers or {}).get(uid), lease))
        return plan.execute(
            self.engine, snap, plans, merging, rows.rows, rows.first, rows.last, now=now,
            batch_txn=(self.app_id, batch_id) if batch_id is not None else None, records=records,
            # Never twice in a row: under a publish rate that fans out more than the limit in
            # every batch, the job would otherwise lease nothing for as long as it lasts.
            lease_fanout_limit=None if self._held_leases else FANOUT_LIMIT,
            max_bytes=max(0, self.settings.max_queued_bytes - queued_bytes), oversize_ok=queued_bytes == 0,
            history=self.history,
        )

    def _export(self, exports: Mapping[str, SubscriptionRecord], budget: int) -> tuple[int, int]:
        """Run the Delta export subscriptions (``exporter``); how many messages were appended and acked.
        Their figures and errors go to the job's state for them, so the backlog table shows them."""
        if self._exporter is None:
            self._exporter = DeltaExporter(self.engine, os.path.join(self.checkpoint, "exports"), clock=self._clock,
                                           history=self.history.enabled)  # (off on delta-spark: see __init__)
        done: ExportReport = self._exporter.run(exports, budget)
        for uid, out in done.outcomes.items():
            st = self.book.state(uid)
            st.delivered += out.appended
            st.acked += out.acked
            if out.status is not None:
                st.last_status = out.status
            if out.error is not None:
                st.last_error = out.error
        return done.appended, sum(out.acked for out in done.outcomes.values())

    def _dead_letter_movers(self, subs: Mapping[str, SubscriptionRecord]) -> dict[str, DeadLetterMover]:
        """The dead-letter moves of the push subscriptions with a policy whose topic exists,
        each recovered (``dead_letter.prepare``), by uid."""
        movers: dict[str, DeadLetterMover] = {}
        for uid, rec in subs.items():
            if rec.dead_letter_policy is not None:
                _, found = dead_letter.prepare(self.engine, rec, hooks_for(rec), self._clock, self.registry)
                if found is not None:
                    movers[uid] = found
        return movers

    def _collect(self, wait: bool = False) -> Collected | None:
        """What the push workers reported since the last batch (None: no workers yet).

        With `wait` (the job is stopping), first wait for what the workers hold, up to the
        longest ack deadline: after that their leases have expired anyway."""
        if self._pool is None:
            return None
        if wait:
            within, hurry = self._drain_limits
            # Nothing more is leased; what is leased is still pushed. A push's request times out
            # at its ack deadline and a request still waiting at the end of its lease is not
            # sent, so once the ledger's last give-up time has passed (each push's own lease
            # end, whatever allowance it was granted with, plus a grace for reporting) every
            # push has an outcome. `within` caps that wait; `hurry` ends it.
            lease = self._pool.ledger.settled_within()
            bound = lease + DRAIN_GRACE if within is None else min(within, lease + DRAIN_GRACE)
            if not self._pool.wait_settled(bound, cancel=hurry):
                self._pool.stop_handing_out()
                log.info("stopped waiting for %d pushes in flight; their leases expire and they are redelivered",
                         self._pool.outstanding())
        return self._pool.collect()

    def _launch(
        self,
        subs: Mapping[str, SubscriptionRecord],
        leases: Mapping[str, list[tuple[str, int]]],
        leased_at: float,
        lease_expires: Mapping[str, float],
    ) -> int:
        """Queue the leases' requests for the push workers (started on first use); how many.
        Their `lease_expires` is on this host's clock (``local_deadline``): the workers and
        the ledger judge it with their own clocks, not storage time."""
        sent = 0
        for uid, items in leases.items():
            ends = lease_expires.get(uid)
            table = self.requests.build(subs[uid], items, leased_at, None if ends is None else local_deadline(self._clock, ends))
            if table.num_rows == 0:
                continue
            pool = self._start_pool()
            self.book.pushed(uid, table["message_id"].to_pylist(), leased_at)
            sent += table.num_rows
            pool.submit(uid, table)
        return sent

    def _start_pool(self) -> PushPool:
        """The push workers, started with the first pushes."""
        if self._pool is None:
            self._pool = PushPool(self.spark, workers=self.settings.delivery_partitions)
        return self._pool

    def refresh_backlog(self, force: bool = False) -> bool:
        """Rewrite the backlog table now if due (or `force`); whether it did."""
        return self.backlog.refresh(self.push_subscriptions(), self.book, force=force)

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
            self.summary.peak_push_bytes = max(self.summary.peak_push_bytes, self._pool.ledger.peak_bytes)
            self._pool.close(wait)
            self._pool = None
        if self._exporter is not None:
            self._exporter.close()
            self._exporter = None
