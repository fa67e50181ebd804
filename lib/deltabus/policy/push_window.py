"""Push window (slow start): how many pushes a subscription may have outstanding.

Starts at 3. Each ack grows it by one while under 3,000, so a fully acked window
doubles every round trip (exponential). Past 3,000 it grows linearly, by 3,000 per
window's worth of acks (each ack adds 3,000 / window, as TCP's congestion avoidance adds
one segment per round trip), up to 30,000, and only while the subscription acks more
than 99% of pushes with an average latency under 1 s; otherwise it falls back to 3,000.
Each nack takes ``NACK_SHRINK`` (half a push) off it, never below 1: a round where the
whole window nacks halves it, and a window of 1,000 with 10 nacks loses 5. So the window
shrinks in proportion to the nack fraction. In slow start a full window's round moves it
by a factor 2 - 1.5 f (f the nack fraction): it still grows while fewer than two thirds of
the pushes fail, and collapses only for an endpoint that mostly fails, which the backoff
(``push_backoff.py``) paces as well.
(Halving on any nacking round, as before, kept a 1-in-10 flaky endpoint's window near 1.)

Growth and shrinkage are counted per outcome, not per micro-batch, so they do not depend
on how outcomes happen to be split between batches.
"""

from __future__ import annotations

from dataclasses import dataclass

START = 3
SLOW_START_LIMIT = 3_000
MAX_WINDOW = 30_000
LINEAR_STEP = 3_000  # per window's worth of acks
EWMA_ALPHA = 0.3
HEALTHY_LATENCY = 1.0
HEALTHY_ACK_RATIO = 0.99
NACK_SHRINK = 0.5  # pushes taken off the window per nack


@dataclass(frozen=True, slots=True)
class PushWindow:
    size: float = START
    avg_latency: float = 0.0  # seconds, EWMA over rounds
    ack_ratio: float = 1.0  # EWMA over rounds

    @property
    def limit(self) -> int:
        return max(1, int(self.size))

    def room(self, outstanding: int) -> int:
        return max(0, self.limit - outstanding)

    def after_round(self, acks: int, nacks: int, mean_latency: float, expired: int = 0) -> "PushWindow":
        """`expired` (counted in `nacks` too): pushes whose lease ended before a worker could
        send them. That is our own sending falling behind the window, not the endpoint, so
        such a round halves the window: measured on the 10k-message, three-subscription test
        on a loaded 2-core machine, shrinking by half a push per expiry kept leasing more than
        the workers could send within the deadline (3,774 expired of 33,774 pushes)."""
        total = acks + nacks
        if total == 0:
            return self
        latency = (1 - EWMA_ALPHA) * self.avg_latency + EWMA_ALPHA * mean_latency if self.avg_latency else mean_latency
        ratio = (1 - EWMA_ALPHA) * self.ack_ratio + EWMA_ALPHA * (acks / total)
        size = self.size
        if size < SLOW_START_LIMIT:
            exponential = min(float(SLOW_START_LIMIT) - size, float(acks))
            size += exponential
            if size >= SLOW_START_LIMIT and latency < HEALTHY_LATENCY and ratio > HEALTHY_ACK_RATIO:
                size = min(float(MAX_WINDOW), size + LINEAR_STEP * (acks - exponential) / size)
        elif latency < HEALTHY_LATENCY and ratio > HEALTHY_ACK_RATIO:
            size = min(float(MAX_WINDOW), size + LINEAR_STEP * acks / size)
        if size > SLOW_START_LIMIT and (latency > HEALTHY_LATENCY or ratio < HEALTHY_ACK_RATIO):
            size = float(SLOW_START_LIMIT)
        size = max(1.0, size - NACK_SHRINK * nacks)
        if expired:
            size = max(1.0, size / 2)
        return PushWindow(size=size, avg_latency=latency, ack_ratio=ratio)
