"""Push backoff: nacks and expired deadlines pause a whole subscription's pushes.

One *round* is the set of push outcomes collected together (one micro-batch). A round
with any nack (non-2xx status, connection error, or no answer within the deadline)
doubles the pause, from 100 ms up to 60 s, and pauses pushing for a jittered
50..100% of it. A clean round halves the pause; below 100 ms it is gone.

With this, an endpoint that nacks everything is retried every 30-60 s once the pause
has saturated, and one that nacks 1 in 5 keeps a pause of a few hundred ms, so it is
pushed to about every half second (see tests/unit/test_push_backoff.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MIN_DELAY = 0.1
MAX_DELAY = 60.0


@dataclass(frozen=True, slots=True)
class PushBackoff:
    delay: float = 0.0  # current pause length; 0 = no backoff
    paused_until: float = 0.0  # epoch seconds before which nothing is pushed

    def may_push(self, now: float) -> bool:
        return now >= self.paused_until

    def after_round(self, acks: int, nacks: int, now: float, rand: float) -> "PushBackoff":
        """The state after a round with these outcomes; `rand` is drawn from [0, 1)."""
        if nacks > 0:
            delay = MIN_DELAY if self.delay == 0 else min(MAX_DELAY, self.delay * 2)
            pause = delay * (0.5 + 0.5 * rand)
            return PushBackoff(delay=delay, paused_until=max(self.paused_until, now + pause))
        if acks > 0:
            delay = self.delay / 2
            return replace(self, delay=0.0 if delay < MIN_DELAY else delay)
        return self
