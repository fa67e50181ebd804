"""When the push job commits: every micro-batch while the push workers are short of work,
less often while they hold plenty. No I/O.

A commit (one MERGE of fan-out, leases, acks and nacks) has a fixed cost of tens of
milliseconds however few rows it carries. While the workers have more queued than they
can send before the next micro-batch, a commit now would only queue more and merge acks
a little sooner; the job then lets outcomes accumulate (in memory, as between any two
batches) and commits at least every ``max_interval`` seconds. At light load the queue is
empty and every batch commits, so publish-to-push latency is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class CommitPacing:
    max_interval: float = 1.0  # seconds between commits at most
    low_water: float = 0.75  # commit when the queue holds less than this many seconds of sending

    def __post_init__(self) -> None:
        if not 0 <= self.max_interval <= 60:
            raise InvalidArgument("max_interval", f"must be 0..60 seconds, got {self.max_interval}")
        if not 0 <= self.low_water <= 60:
            raise InvalidArgument("low_water", f"must be 0..60 seconds, got {self.low_water}")

    def due(self, now: float, last_commit: float, *, queued: int, send_rate: float) -> bool:
        """Commit in this batch? `queued`: pushes waiting for a worker; `send_rate`: recent
        outcomes per second."""
        if now - last_commit >= self.max_interval:
            return True
        return queued <= send_rate * self.low_water


def rate_after(rate: float, outcomes: int, seconds: float, alpha: float = 0.3) -> float:
    """Outcomes per second, smoothed over batches (EWMA)."""
    if seconds <= 0:
        return rate
    return (1 - alpha) * rate + alpha * (outcomes / seconds)
