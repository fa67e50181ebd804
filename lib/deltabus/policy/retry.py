"""A subscription's retry policy: how long a nacked or expired message waits before it is due again.

Pub/Sub documents the policy as an exponential backoff between ``minimum_backoff`` and
``maximum_backoff`` that grows with the message's delivery attempts; it does not publish
the exact curve. The one used here:

    delay(n) = min(maximum_backoff, minimum_backoff * 2 ** (n - 1))

where ``n >= 1`` is the delivery attempt that failed (was nacked, or whose lease ran out).
The first failure waits ``minimum_backoff``, each further one twice as long, up to
``maximum_backoff``. With the defaults (10 s, 600 s): 10, 20, 40, 80, 160, 320, 600, 600...
A ``minimum_backoff`` of 0 means no wait at all, whatever the maximum (doubling zero stays
zero): set a minimum above zero for growth. From attempt 64 on the delay is the maximum
(only a minimum under 1e-16 s would not have reached it by then); this bounds ``steps``.

No jitter, on purpose. A nack stores the time the message is due, but an expiry is never
written: a lease that ran out is only noticed when selection reads the row. So the delay of
an expired message must be recomputable at read time from what the row holds (its lease end
and its attempt), and the same rule then serves both. Because ``delay`` is a non-decreasing
step function of the attempt that reaches the maximum after a few doublings, ``steps`` turns
it into a short list of attempt ranges (one per distinct delay), which selection turns into
one filter expression per read: no Python work per row.

Pure: no clock, no randomness; "now" is the caller's.
"""

from __future__ import annotations

from typing import NamedTuple

from ..types import RetryPolicy

__all__ = ["CAP_ATTEMPT", "Step", "delay", "steps"]

# A policy reaches its maximum after log2(max/min) + 1 attempts: 30 from 1 us to 600 s.
# Doubling from the smallest positive float would take ~1085, so from this attempt on the
# delay is the maximum, which bounds the loop and the filter ``steps`` gives.
CAP_ATTEMPT = 64


def delay(policy: RetryPolicy, attempt: int) -> float:
    """Seconds a message waits after delivery attempt `attempt` (>= 1) failed, under `policy`."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1 (the delivery that failed), got {attempt}")
    if policy.minimum_backoff <= 0:
        return 0.0
    if attempt >= CAP_ATTEMPT:
        return policy.maximum_backoff
    # Stop doubling once past the cap (and 2 ** attempt would overflow a float past 1023).
    value = policy.minimum_backoff
    for _ in range(attempt - 1):
        if value >= policy.maximum_backoff:
            break
        value *= 2
    return min(value, policy.maximum_backoff)


class Step(NamedTuple):
    """Attempts ``first..last`` (``last`` None: and every later one) all wait ``seconds``."""

    first: int
    last: int | None
    seconds: float


def steps(policy: RetryPolicy) -> tuple[Step, ...]:
    """``delay`` as attempt ranges, in attempt order: every attempt >= 1 is in exactly one.

    The last step is open-ended (``last`` None); there are at most ``CAP_ATTEMPT`` steps."""
    out: list[Step] = []
    attempt = 1
    while True:
        seconds = delay(policy, attempt)
        if seconds >= policy.maximum_backoff or seconds == 0.0 or attempt >= CAP_ATTEMPT:
            out.append(Step(attempt, None, seconds))
            return tuple(out)
        out.append(Step(attempt, attempt, seconds))
        attempt += 1
