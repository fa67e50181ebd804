"""Storage time from a process's own clock: the offset estimate and its error bars (issue 16). Pure.

Leases are timestamps compared across processes: a puller writes ``lease_expires`` from its
clock, and every other puller judges it expired with its own. A clock 30 s ahead took
leases that were still running for 10 s more (bench/chaos_skew.py). So lease arithmetic
runs on one clock that every process can read: the storage's. A file's modification time
on a local or network file system is set by the storage (the kernel, the file server), not
by the writer's clock, so a process that notes its own clock just before and just after a
write learns where the storage's clock stood in between.

One observation: local readings `before` and `after` around a write whose stamp is `stamp`
(storage seconds). The write happened at some moment between the two readings, and the
stamp may lag that moment by up to the storage's ``granularity`` (Linux stamps files from
its coarse clock: up to one tick, measured at most 5.2 ms here). So the offset
``storage - local`` lies in ``[stamp - after, stamp + granularity - before]``. Observations
intersect: the estimate is the narrowest interval consistent with all of them, widened by
``drift`` per second elapsed since (the two clocks' rates may differ; 500 ppm is NTP's
slew limit). An observation outside the widened estimate, or a step of the local clock
(its distance to the monotonic clock moved), starts the estimate again.

The bound. With ``earliest = local + low`` and ``latest = local + high`` (the estimate at
the moment of reading), the storage's time is in ``[earliest, latest]``. A lease is granted
until ``latest + seconds`` and judged expired only when ``earliest`` has passed it, so a
lease is never judged expired by any process before it has run `seconds` of storage time,
whatever the processes' clocks say, while the estimates hold. What it costs: each lease
runs up to the granter's ``high - low`` plus the judge's longer than asked (milliseconds
on a local disk). What it rests on: one storage clock (every puller's warehouse on the same
file system), stamps it sets itself, a stamp lag no larger than ``granularity`` (a file
system with whole-second stamps gets 2 s: ``granularity_of``), and rates within ``drift``.
A process whose offset is known less well than ``max_uncertainty`` (``high - low``)
refuses to lease (``refusal``) rather than hand out a lease others may judge wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..errors import InvalidArgument

# Stamps that are whole seconds come from a file system of second (FAT: two-second) stamps.
COARSE_GRANULARITY = 2.0


@dataclass(frozen=True, slots=True)
class ClockSkewPolicy:
    """How a process keeps storage time. ``correct=False``: it uses its own clock as is."""

    correct: bool = True
    granularity: float = 0.02  # seconds a storage stamp may lag the moment it names
    drift: float = 500e-6  # how fast the local and the storage clock may drift apart (s/s)
    refresh_seconds: float = 10.0  # with no commit observed for this long, probe the storage
    max_uncertainty: float = 5.0  # refuse to lease while the offset is known less well (high - low)
    step_tolerance: float = 0.002  # a local clock step larger than this restarts the estimate

    def __post_init__(self) -> None:
        if not 0 <= self.granularity <= 60:
            raise InvalidArgument("clock_skew.granularity", f"must be 0..60 seconds, got {self.granularity}")
        if not 0 <= self.drift <= 0.01:
            raise InvalidArgument("clock_skew.drift", f"must be 0..0.01 seconds per second, got {self.drift}")
        if not 0.1 <= self.refresh_seconds <= 3600:
            raise InvalidArgument("clock_skew.refresh_seconds", f"must be 0.1..3600 seconds, got {self.refresh_seconds}")
        if not 0 < self.max_uncertainty <= 600:
            raise InvalidArgument("clock_skew.max_uncertainty", f"must be more than 0 and at most 600 seconds, got {self.max_uncertainty}")
        if not 0 <= self.step_tolerance <= 60:
            raise InvalidArgument("clock_skew.step_tolerance", f"must be 0..60 seconds, got {self.step_tolerance}")


class Interval(NamedTuple):
    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def middle(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True)
class Estimate:
    """Offset bounds (storage - local, seconds) as of the monotonic reading `at`, and the
    local clock's distance to the monotonic one then (``local - monotonic``), to tell a
    step of the local clock from time passing."""

    offset: Interval
    at: float
    local_minus_mono: float
    observations: int = 1


def granularity_of(stamp_ns: int, default: float) -> float:
    """How late a stamp may be: `default`, or ``COARSE_GRANULARITY`` for a whole-second stamp
    (a fine stamp lands on a whole second once in 10^9; the next observation narrows it)."""
    return COARSE_GRANULARITY if stamp_ns % 1_000_000_000 == 0 else default


def observed(before: float, after: float, stamp: float, granularity: float) -> Interval:
    """The offsets (storage - local) consistent with a write stamped `stamp` that happened
    between local readings `before` and `after`."""
    if after < before:
        raise ValueError(f"after ({after}) is before before ({before})")
    return Interval(stamp - after, stamp + granularity - before)


def bounds(estimate: Estimate, mono: float, drift: float) -> Interval:
    """`estimate`'s offset bounds at the monotonic reading `mono`: widened by the drift
    possible since (never narrowed by a clock going back)."""
    spread = drift * max(0.0, mono - estimate.at)
    return Interval(estimate.offset.low - spread, estimate.offset.high + spread)


def stepped(estimate: Estimate, local: float, mono: float, policy: ClockSkewPolicy) -> bool:
    """Whether the local clock moved against the monotonic one since `estimate` (set by
    hand, stepped by NTP, or a test's clock) by more than drift and ``step_tolerance``."""
    moved = abs((local - mono) - estimate.local_minus_mono)
    return moved > policy.step_tolerance + policy.drift * max(0.0, mono - estimate.at)


def combine(
    previous: Estimate | None, seen: Interval, local: float, mono: float, policy: ClockSkewPolicy
) -> tuple[Estimate, bool]:
    """The estimate after observing `seen` (local and monotonic readings `local`, `mono`
    taken at the observation's end). Returns it and whether it started again: no previous
    estimate, the local clock stepped, or `seen` lies outside the previous bounds (then the
    new observation wins: the older ones no longer describe this clock)."""
    if previous is None or stepped(previous, local, mono, policy):
        return Estimate(seen, mono, local - mono), True
    widened = bounds(previous, mono, policy.drift)
    low, high = max(widened.low, seen.low), min(widened.high, seen.high)
    if low > high:
        return Estimate(seen, mono, local - mono), True
    return Estimate(Interval(low, high), mono, previous.local_minus_mono, previous.observations + 1), False


def usable(estimate: Estimate | None, local: float, mono: float, policy: ClockSkewPolicy) -> Interval | None:
    """The offset bounds now, however old the estimate (widened by drift), or None: no
    estimate, or the local clock stepped since (the estimate no longer describes it)."""
    if estimate is None or stepped(estimate, local, mono, policy):
        return None
    return bounds(estimate, mono, policy.drift)


def current(estimate: Estimate | None, local: float, mono: float, policy: ClockSkewPolicy) -> Interval | None:
    """The offset bounds to use now, or None when the storage should be read again first: no
    estimate, the local clock stepped, or nothing observed for ``refresh_seconds``."""
    if estimate is not None and mono - estimate.at > policy.refresh_seconds:
        return None
    return usable(estimate, local, mono, policy)


def refusal(offset: Interval, policy: ClockSkewPolicy) -> str | None:
    """Why a lease may not be granted with these offset bounds, or None."""
    if offset.width <= policy.max_uncertainty:
        return None
    return (
        f"this clock is {_relation(offset.middle)} the storage's, known only to ±{offset.width / 2:.3f} s; "
        f"leases need it known to within {policy.max_uncertainty:g} s (clock_skew.max_uncertainty): "
        "storage stamps too coarse, or writes too slow to time"
    )


def _relation(offset: float) -> str:
    """How a clock whose offset (storage - local) is `offset` stands to the storage's."""
    if offset == 0:
        return "level with"
    return f"{abs(offset):.3f} s {'behind' if offset > 0 else 'ahead of'}"
