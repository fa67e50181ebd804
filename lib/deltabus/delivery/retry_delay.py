"""The retry policy's two hooks: the lease a nack sets, and which rows are due again.

Contract, for a subscription with a ``RetryPolicy`` (``policy/retry.py`` has the delay):

- ``nack_hook(policy)`` is ``DeliveryHooks.retry_delay``: a nack of delivery attempt ``n``
  at ``now`` stores ``delayed_nack_us(now + delay(n))``, the negated due time (below the
  nacked mark, so a racing deadline extension still never applies: ``merge``'s docstring).
- ``due_hook(policy)`` is ``DeliveryHooks.due``: the filter ``selection.read_available``
  uses instead of its default. A row is available at ``now`` when it was never delivered
  (null lease), or it is nacked and its due time has come (``-lease_expires <= now``; the
  plain NACKED sentinel 0 is due at once), or its lease ran out at least
  ``delay(delivery_attempt)`` ago (``lease_expires + delay <= now``): an expiry waits the
  same delay as a nack of that attempt, counted from the end of the lease.

The filter is one Arrow expression built per read from the policy's few ``steps``
(attempt ranges sharing one delay), so rows are never visited in Python; delta-rs applies
it in its scan and delta-spark to the Arrow it reads, so both engines get the same rule.
Without a policy neither hook is set and the default path is exactly as before. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ..policy.retry import Step, delay, steps
from ..timestamps import TS, to_us
from ..types import RetryPolicy
from .merge import NACKED_MAX_US, delayed_nack_us

__all__ = ["nack_hook", "due_hook", "nack_due_us"]


def nack_due_us(policy: RetryPolicy, attempts: pa.Array | pa.ChunkedArray, now: float) -> pa.Array:
    """When (us since the epoch) nacks of these delivery attempts at `now` are due again."""
    column = attempts.combine_chunks() if isinstance(attempts, pa.ChunkedArray) else attempts
    # One delay per distinct attempt (a batch of nacks holds few), then gathered per row in Arrow.
    distinct = pc.unique(column)
    delays = pa.array([to_us(delay(policy, max(1, int(a)))) for a in distinct.to_pylist()], pa.int64())
    per_row = pc.take(delays, pc.index_in(column, value_set=distinct))
    return pc.add(per_row, pa.scalar(to_us(now), pa.int64()))


@dataclass(frozen=True, slots=True)
class _NackDelay:
    policy: RetryPolicy

    def __call__(self, nacked: pa.Table, now: float) -> pa.Array:
        return delayed_nack_us(nack_due_us(self.policy, nacked["delivery_attempt"], now))


@dataclass(frozen=True, slots=True)
class _Due:
    policy: RetryPolicy
    plan: tuple[Step, ...]

    def __call__(self, now: float) -> pc.Expression:
        lease = pc.field("lease_expires")
        attempt = pc.field("delivery_attempt")
        now_us = to_us(now)
        mark = pa.scalar(NACKED_MAX_US, TS)
        nacked_due = (lease <= mark) & (lease >= pa.scalar(-now_us, TS))
        expired: pc.Expression | None = None
        for step in self.plan:
            in_range = attempt >= step.first if step.last is None else (attempt >= step.first) & (attempt <= step.last)
            term = in_range & (lease > mark) & (lease <= pa.scalar(now_us - to_us(step.seconds), TS))
            expired = term if expired is None else expired | term
        assert expired is not None  # steps() always gives at least one
        return lease.is_null() | nacked_due | expired


# Hooks are values (frozen dataclasses), not closures, so the hooks of two equal
# subscriptions compare equal, as the other policies' do.
def nack_hook(policy: RetryPolicy) -> Callable[[pa.Table, float], pa.Array]:
    """``DeliveryHooks.retry_delay`` for `policy`: the lease_expires (us) of each nacked row."""
    return _NackDelay(policy)


def due_hook(policy: RetryPolicy) -> Callable[[float], pc.Expression]:
    """``DeliveryHooks.due`` for `policy`: the rows available at `now` (see the module doc)."""
    return _Due(policy, steps(policy))
