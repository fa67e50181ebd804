"""When a push lease starts counting: once the commit that grants it has landed. No I/O.

The push job decides its leases at `now` and grants them in the batch's MERGE; the workers
get them only after that commit. Pub/Sub counts a push's ack deadline from the push, so a
lease that counted from `now` lost the commit's duration before any worker saw it. That
is tens of milliseconds on delta-rs, and seconds on delta-spark. Measured here on 2 cores
(3 push subscriptions, 30,000 messages): 2.6-6.3 s per batch, and 24.9 s for the first
batch, which fanned 30,000 rows out; with a 10 s ack deadline that batch's leases all
expired before they were sent, and came back as nacks.

So a lease is granted for its ack deadline plus an allowance: the longest of the job's last
few commits, with a margin, and never more than one more ack deadline (a message whose
worker died then comes back after at most two deadlines, not one). Until the job has
timed a commit it assumes the longest allowance, one more deadline: with none, 3 of the
delta-spark quickstart's 500 first pushes still expired unsent on this machine under load.
What makes a commit slow is mostly how many rows it fans out (the first batch above: 30,000
rows, 25 s; later ones 3-6 s), and that is known only while planning: so a batch that fans
out more than FANOUT_LIMIT rows grants no leases at all (the next batch leases them, with
that commit's time in its allowance), but never twice in a row: under a publish rate that
fans out more than that in every batch, the job would otherwise lease nothing at all. On
delta-rs such a batch takes well under a second, so this costs one micro-batch when a
backlog is caught up.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

# How many recent commits the allowance looks at, and the margin over the longest.
WINDOW = 5
MARGIN = 1.5
# Rows fanned out in one commit above which it grants no leases: about 4 s of a delta-spark
# MERGE here (0.8 ms per row), a small part of the 10 s default ack deadline.
FANOUT_LIMIT = 5_000


def allowance(recent: Iterable[float], deadline: float) -> float:
    """Seconds added to a lease of `deadline` seconds, given the durations of recent commits
    (none timed yet: the most it can be, `deadline`)."""
    times = list(recent)
    return min(deadline, max(times) * MARGIN) if times else deadline


class CommitTimes:
    """The durations of the last WINDOW commits (seconds)."""

    __slots__ = ("_times",)

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=WINDOW)

    def add(self, seconds: float) -> None:
        self._times.append(max(0.0, seconds))

    def allowance(self, deadline: float) -> float:
        return allowance(self._times, deadline)
