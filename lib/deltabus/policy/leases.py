"""Lease extension: how long each extension is, when to extend, and which leases to drop."""

from __future__ import annotations

from typing import Iterable, Mapping, TypeVar

from ..types import FlowControl
from .histogram import MAX_SECONDS, MIN_SECONDS

K = TypeVar("K")

# The leaser wakes at a random point no later than this fraction of the deadline, so an
# extension lands before the previous one runs out even when its commit has to retry.
MAX_SLEEP_FRACTION = 0.7
MIN_SLEEP = 0.01


def extension_seconds(p99_ack_delay: int, flow: FlowControl) -> int:
    """Length of the next extension: the p99 ack delay, bounded by flow control, within 10..600."""
    deadline = p99_ack_delay
    if flow.max_duration_per_lease_extension:
        deadline = min(deadline, int(flow.max_duration_per_lease_extension))
    if flow.min_duration_per_lease_extension:
        deadline = max(deadline, int(flow.min_duration_per_lease_extension))
    return max(MIN_SECONDS, min(MAX_SECONDS, deadline))


def next_pass_delay(deadline_seconds: float, rand: float) -> float:
    """Seconds until the next extension pass, `rand` drawn from [0, 1)."""
    high = max(MIN_SLEEP, deadline_seconds * MAX_SLEEP_FRACTION)
    return MIN_SLEEP + (high - MIN_SLEEP) * rand


def over_max_lease(leased_at: Mapping[K, float], now: float, max_lease_duration: float) -> list[K]:
    """Leases held longer than max_lease_duration: stop extending them."""
    cutoff = now - max_lease_duration
    return [k for k, t in leased_at.items() if t < cutoff]


def split_due(items: Iterable[tuple[K, float]], now: float) -> list[K]:
    """Keys whose deadline (epoch seconds) has passed at `now`."""
    return [k for k, deadline in items if deadline <= now]
