"""StorageClock: the storage's time, read from this process's clock (issue 16).

A callable like ``time.time`` that returns the earliest time the storage's clock may show
now, ``local() + low`` (``policy.clock_skew``: the offset estimate and its bound), and
``latest()`` the latest, ``local() + high``. Leases are granted from ``latest`` and judged
from the call (``deadline`` below), so no process judges a lease expired before it has run
its length in storage time, however far the processes' own clocks are apart.

Where the estimate comes from, on a warehouse on a local or network file system:

- *Commits.* ``attach(engine)`` makes the engine report each commit it makes: the local
  readings just before and after, and the stamp (mtime) of the log file the commit wrote
  (delta-rs; ``Engine.observe_commits``). A busy process never needs anything else.
- *Probes.* With no estimate, or none refreshed for ``refresh_seconds``, or a step of the
  local clock, a call writes a small file in the warehouse's folder, reads its stamp and
  deletes it (about 0.1 ms on a local disk). The delta-spark engine reports no commits
  (they happen in the JVM), so it lives on probes.

Where it does not apply: a warehouse on an object store (its URI has a scheme): nothing
here reads an object's Last-Modified, so the clock is the local one, as before, and one
warning says so. The same when a probe cannot be written (a read-only folder; the
deliveries table's folder is tried after the warehouse's).

Recovering. A failed probe is not tried again for ``refresh_seconds`` (a probe on a slow
network file system costs a round trip). ``latest`` tries one fresh probe before it refuses
(at most one a second: an idle process whose estimate drifted too wide would otherwise be
refused forever, a refused pull committing nothing to observe), and its refusal names the
probe's failure. A local clock stepping back between the two readings of an observation
(after < before) is a step: the estimate starts again from the next observation.

Thread-safe: the engine's committing threads report while others read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ..errors import ClockUncertain
from .tables import DELIVERIES
from ..policy.clock_skew import (ClockSkewPolicy, Estimate, Interval, bounds, combine, current, granularity_of, observed, refusal,
                                 usable)

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

log = logging.getLogger(__name__)

PROBE_PREFIX = ".deltabus-clock-"
# The fewest seconds between two probes ``latest`` makes before refusing a lease.
REFUSAL_PROBE_SECONDS = 1.0


class CommitObserver(Protocol):
    """What an engine reports its commits to (``Engine.observe_commits``)."""

    def local(self) -> float:
        """The observer's own clock, read by the engine just before and just after a commit."""
        ...

    def committed(self, before: float, after: float, stamp_ns: int) -> None:
        """A commit wrote a log file stamped `stamp_ns` (storage ns since the epoch) between
        the observer's readings `before` and `after`."""
        ...


def local_folder(warehouse: str) -> str | None:
    """The warehouse's folder when it is on a file system (a path or a file:// URI), else None."""
    if warehouse.startswith("file://"):
        return warehouse.removeprefix("file://")
    return None if "://" in warehouse else warehouse


class StorageClock:
    """The storage's time (see the module docstring). `local`: this process's clock (the
    injected one in tests); `monotonic`: tells a step of `local` from time passing."""

    def __init__(
        self,
        local: Callable[[], float] = time.time,
        policy: ClockSkewPolicy = ClockSkewPolicy(),
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._local = local
        self._mono = monotonic
        self._lock = threading.Lock()
        self._estimate: Estimate | None = None
        self._folder: str | None = None
        self._fallback: str | None = None  # the deliveries table's folder: probed when the warehouse's cannot be
        self._failed_at: float | None = None  # monotonic reading of the last failed probe (backing off)
        self._refusal_probe_at: float | None = None  # monotonic reading of the last probe latest() made
        self._probe_error: str | None = None  # why the last probe failed (None: it did not)
        self._unavailable: str | None = "no warehouse attached yet"
        self._warned = False
        self._engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()  # weakly: an engine gone is no longer attached
        self.restarts = 0  # estimates started again after the first (a step, an outlier)
        self.probes = 0
        self.widest_pad = 0.0  # the largest high - low a lease was granted with

    # -- wiring -----------------------------------------------------------------------
    def attach(self, engine: "Engine") -> None:
        """Take storage time from `engine`'s warehouse: its commits, and probes of its folder.
        Idempotent per engine."""
        with self._lock:
            if engine in self._engines:
                return
            self._engines.add(engine)
            folder = local_folder(engine.warehouse)
            if folder is not None and self._folder is None:
                self._folder = folder
                self._unavailable = None
                table = local_folder(engine.table_uri(DELIVERIES.name))
                self._fallback = table if table is not None and table != folder else None
            elif folder is None and self._folder is None:
                self._unavailable = f"the warehouse {engine.warehouse} is not on a file system (no storage stamps read)"
        engine.observe_commits(self)

    # -- CommitObserver ---------------------------------------------------------------
    def local(self) -> float:
        return self._local()

    def committed(self, before: float, after: float, stamp_ns: int) -> None:
        self._observe(before, after, stamp_ns)

    # -- reading ----------------------------------------------------------------------
    def __call__(self) -> float:
        """The earliest the storage's clock may show now (the local clock while no estimate can be had)."""
        offset, local = self._now()
        return local if offset is None else local + offset.low

    def latest(self) -> float:
        """The latest the storage's clock may show now: what deadlines others judge are set
        from (``deadline``). Raises ``ClockUncertain`` when the estimate is wider than the
        policy's ``max_uncertainty``."""
        offset, local = self._now()
        if offset is None:
            return local
        reason = refusal(offset, self.policy)
        if reason is not None and self._refusal_probe():  # a fresh observation may narrow it
            offset, local = self._now()
            if offset is None:
                return local
            reason = refusal(offset, self.policy)
        if reason is not None:
            with self._lock:
                failed = self._probe_error
            raise ClockUncertain(f"lease refused: {reason}" + (f"; the last probe of the storage failed: {failed}" if failed else ""))
        with self._lock:
            self.widest_pad = max(self.widest_pad, offset.width)
        return local + offset.high

    def offset(self) -> Interval | None:
        """The offset bounds (storage - local) now, however wide; None: none known."""
        return self._now()[0]

    def describe(self) -> dict[str, Any]:
        """The estimate now, for reports: offset (storage - local) and its error bars, seconds."""
        mono, local = self._read()
        with self._lock:
            estimate = self._estimate
            unavailable = self._unavailable
        if estimate is None:
            return {"available": False, "reason": unavailable or "nothing observed yet"}
        b = bounds(estimate, mono, self.policy.drift)
        return {
            "available": True, "offset": round(b.middle, 6), "low": round(b.low, 6), "high": round(b.high, 6),
            "width": round(b.width, 6), "observations": estimate.observations, "probes": self.probes,
            "restarts": self.restarts, "widest_pad": round(self.widest_pad, 6),
        }

    # -- inside -------------------------------------------------------------------------
    def _read(self) -> tuple[float, float]:
        """(monotonic, local) read back to back (again if something came between them)."""
        m0, local, m1 = self._mono(), self._local(), self._mono()
        for _ in range(2):
            if m1 - m0 <= self.policy.step_tolerance / 4:
                break
            m0, local, m1 = self._mono(), self._local(), self._mono()
        return (m0 + m1) / 2, local

    def _now(self) -> tuple[Interval | None, float]:
        """The offset bounds valid now (probing the storage first when they are missing or
        stale) and the local reading they go with: the last reading of the local clock this
        call makes. None: no usable estimate (the local clock is used as is)."""
        mono, local = self._read()
        with self._lock:
            offset = current(self._estimate, local, mono, self.policy)
            folder = self._folder
        if offset is not None:
            return offset, local
        if folder is None or self._backing_off(mono) or not self._probe(folder):
            self._warn()
        mono, local = self._read()
        with self._lock:  # fresh after a probe; else a stale estimate still holds, widened by drift
            return usable(self._estimate, local, mono, self.policy), local

    def _backing_off(self, mono: float) -> bool:
        """Whether a probe failed less than ``refresh_seconds`` ago (not tried again yet)."""
        with self._lock:
            return self._failed_at is not None and mono - self._failed_at < self.policy.refresh_seconds

    def _refusal_probe(self) -> bool:
        """One fresh probe before a refusal (at most one per REFUSAL_PROBE_SECONDS; none
        while backing off from a failed one); whether it observed the storage."""
        mono = self._mono()
        with self._lock:
            folder = self._folder
            if folder is None or (self._refusal_probe_at is not None and mono - self._refusal_probe_at < REFUSAL_PROBE_SECONDS):
                return False
            self._refusal_probe_at = mono
        return not self._backing_off(mono) and self._probe(folder)

    def _probe(self, folder: str) -> bool:
        """Write, stamp-read and delete a small file in `folder` (the deliveries table's
        folder when that fails); observe its stamp. A failure backs off (``_backing_off``)."""
        with self._lock:
            fallback = self._fallback
        error = self._probe_in(folder)
        if error is not None and fallback is not None and self._probe_in(fallback) is None:
            with self._lock:  # the warehouse's folder is not writable: the table's is from now on
                self._folder, self._fallback = fallback, None
            error = None
        with self._lock:
            self._probe_error = error
            if error is None:
                self._failed_at = None
                return True
            self._failed_at = self._mono()
            self._unavailable = error
            return False

    def _probe_in(self, folder: str) -> str | None:
        """One probe in `folder`: None when its stamp was observed, else why not."""
        path = os.path.join(folder, f"{PROBE_PREFIX}{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}")
        try:
            before = self._local()
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            os.close(fd)
            after = self._local()
            stamp_ns = os.stat(path).st_mtime_ns
        except OSError as exc:
            return f"cannot write a probe in {folder}: {exc}"
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass
        with self._lock:
            self.probes += 1
        self._observe(before, after, stamp_ns)
        return None

    def _observe(self, before: float, after: float, stamp_ns: int) -> None:
        if after < before:  # the local clock stepped back between the readings: start again from the next observation
            with self._lock:
                if self._estimate is not None:
                    self._estimate = None
                    self.restarts += 1
            log.debug("storage clock: the local clock stepped back during an observation (%s < %s)", after, before)
            return
        mono, local = self._read()
        seen = observed(before, after, stamp_ns / 1e9, granularity_of(stamp_ns, self.policy.granularity))
        with self._lock:
            started = self._estimate is not None
            self._estimate, restarted = combine(self._estimate, seen, local, mono, self.policy)
            if restarted and started:
                self.restarts += 1
                log.debug("storage clock: estimate started again (local clock stepped, or an outlier): %s", seen)

    def _warn(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning("storage clock unavailable, leases use this host's clock as is: %s", self._unavailable)


def deadline(clock: Callable[[], float], now: float, seconds: float) -> float:
    """A deadline `seconds` after `now` (read from `clock`) that other processes will judge:
    from the storage's latest possible time when `clock` is a ``StorageClock`` (so no other
    process's earliest time reaches it early), else ``now + seconds``. May raise
    ``ClockUncertain`` (a lease must then not be granted)."""
    if isinstance(clock, StorageClock):
        return max(now, clock.latest()) + seconds
    return now + seconds


def local_deadline(clock: Callable[[], float], storage_deadline: float) -> float:
    """A deadline set in storage time (a lease's end, ``deadline``) on this host's own clock
    (``wall(clock)``), for code that judges it with that clock (push workers, the push
    ledger): no later than the storage time truly reaches it (less the offset's high
    bound). Unchanged when `clock` is no ``StorageClock`` or no offset is known."""
    if isinstance(clock, StorageClock):
        offset = clock.offset()
        if offset is not None:
            return storage_deadline - offset.high
    return storage_deadline


def wall(clock: Callable[[], float]) -> Callable[[], float]:
    """The clock events are stamped with (publish times; create, update and use times):
    this process's own clock, the local clock under a ``StorageClock``. Only lease arithmetic
    runs on the storage's time. Why: a ``StorageClock`` call is the storage's EARLIEST
    possible time, tens of milliseconds behind this host's clock, so a message published
    just after a user read ``time.time()`` got an earlier publish time, and a seek to that
    reading counted the message as acked (tests/integration/test_seek.py). Pub/Sub stamps
    publish times with its own servers' clocks, never a lower bound."""
    return clock.local if isinstance(clock, StorageClock) else clock


def resolve_clock(clock: Callable[[], float] | None, clock_skew: ClockSkewPolicy | None) -> Callable[[], float]:
    """The clock an entry point (a client, the server, the push job) keeps time with: without
    `clock_skew`, a new ``StorageClock`` over ``time.time`` when no `clock` is given, and a
    given `clock` as it is (a test's clock; a server's StorageClock shared by its clients);
    with `clock_skew`, a StorageClock over `clock` when ``clock_skew.correct`` (a given
    StorageClock is kept), else `clock` as it is. Attach a new StorageClock to the engine
    whose storage it should read (``StorageClock.attach``)."""
    if clock_skew is None:
        clock_skew = ClockSkewPolicy(correct=clock is None)
    if clock_skew.correct and not isinstance(clock, StorageClock):
        return StorageClock(clock or time.time, clock_skew)
    return clock or time.time
