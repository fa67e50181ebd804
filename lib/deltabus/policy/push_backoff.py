"""Push backoff: nacks and expired deadlines pause a whole subscription's pushes.

Pub/Sub sizes the pause by how many of the pushes are nacked, from 100 ms to 60 s: an
endpoint that nacks 1 in 5 of its pushes is pushed to about every 500 ms, one that
nacks everything every 30-60 s. Ours follows the *nack fraction* over the last
``WINDOW_SECONDS``:

- the target delay is ``MIN_DELAY * (MAX_DELAY / MIN_DELAY) ** (f ** SHAPE)`` for a
  nack fraction ``f`` (0 < f <= 1): 60 s when everything fails, ~0.7 s at 20 %
  (a jittered pause of 0.34-0.68 s, so pushes about every half second), ~0.3 s at 10 %,
  0.12 s at 1 %;
- a round with nacks moves the delay toward that target, at most doubling per round
  (starting at 100 ms), so a short burst of failures does not pause for a minute;
- a round without nacks never raises the delay; it halves it, but not below the target
  of the recent window, and below 100 ms the backoff is over. So a subscription leaves
  backoff once a full window passes without nacks;
- while in backoff, every round (every batch of outcomes) pauses pushing for a jittered
  50..100 % of the delay: pushes come about once per delay. A mostly-acking endpoint
  keeps a delay of a few hundred ms or less, shorter than the push job's trigger
  interval, so it is hardly held back at all (and its push window stays large).

The previous rule (any nack in a round doubled the pause, up to 60 s) stalled every
endpoint with a realistic error rate: once the push window is open nearly every round
holds a nack. ``tests/unit/test_push_backoff.py`` keeps Pub/Sub's two documented examples
and a 1-in-10 flaky endpoint against a healthy one.

Pure: time (``now``) and randomness (``rand``) are passed in. The per-message retry delay
(a retry policy) is a separate concern and does not belong here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_DELAY = 0.1
MAX_DELAY = 60.0
WINDOW_SECONDS = 5.0  # the recent outcomes the nack fraction is taken over
# Curve exponent: fitted to Pub/Sub's examples (20 % nacked -> pushes about every 500 ms,
# 100 % -> every 30-60 s); 1.0 would give 0.36 s at 20 %, too short a pause.
SHAPE = 0.75


def target_delay(nack_fraction: float) -> float:
    """The delay a steady nack fraction (0..1) settles at; 0 when nothing is nacked."""
    if nack_fraction <= 0:
        return 0.0
    f = min(1.0, nack_fraction)
    return MIN_DELAY * math.exp(math.log(MAX_DELAY / MIN_DELAY) * f**SHAPE)


@dataclass(frozen=True, slots=True)
class PushBackoff:
    delay: float = 0.0  # current pause length; 0 = no backoff
    paused_until: float = 0.0  # epoch seconds before which nothing is pushed
    recent: tuple[tuple[float, int, int], ...] = ()  # (at, acks, nacks) per round in the last WINDOW_SECONDS

    def may_push(self, now: float) -> bool:
        return now >= self.paused_until

    @property
    def active(self) -> bool:
        return self.delay > 0

    def counts(self) -> tuple[int, int]:
        """(outcomes, nacks) in the recent window."""
        acks = sum(a for _, a, _ in self.recent)
        nacks = sum(n for _, _, n in self.recent)
        return acks + nacks, nacks

    def nack_fraction(self) -> float:
        total, nacks = self.counts()
        return nacks / total if total else 0.0

    def settled(self, now: float) -> "PushBackoff":
        """For a subscription with nothing in flight (so no round will come): once its pause is
        over and the last WINDOW_SECONDS held no nack, its backoff is over. Without this, an
        endpoint that recovered just as its backlog ran out would stay in backoff, idle."""
        if not self.active or now < self.paused_until:
            return self
        if any(n for at, _, n in self.recent if at > now - WINDOW_SECONDS):
            return self
        return PushBackoff(paused_until=self.paused_until)

    def after_round(
        self, acks: int, nacks: int, now: float, rand: float, last_push: float | None = None
    ) -> "PushBackoff":
        """The state after a round with these outcomes; `rand` is drawn from [0, 1).

        `last_push`: when the subscription's last push wave went out. The pause counts from
        it (Pub/Sub spaces its deliveries), not from when the outcomes were folded: those
        arrive a micro-batch later, and counting from then would add a trigger interval to
        every pause, halving a mostly-acking endpoint's rounds."""
        if acks + nacks == 0:
            return self
        recent = tuple(r for r in self.recent if r[0] > now - WINDOW_SECONDS) + ((now, acks, nacks),)
        total = sum(a + n for _, a, n in recent)
        target = target_delay(sum(n for _, _, n in recent) / total)
        if nacks > 0:
            if self.delay > target:
                delay = max(target, self.delay / 2)
            else:
                delay = max(MIN_DELAY, min(target, self.delay * 2))
        else:
            delay = min(self.delay, max(target, self.delay / 2))
            if delay < MIN_DELAY:
                return PushBackoff(delay=0.0, paused_until=self.paused_until, recent=recent)
        start = now if last_push is None else min(now, last_push)
        pause = delay * (0.5 + 0.5 * rand)
        return PushBackoff(delay=delay, paused_until=max(self.paused_until, start + pause), recent=recent)
