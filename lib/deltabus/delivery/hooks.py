"""Policy seams of the delivery core, one per feature still to come; defaults are today's behaviour.

Contract: a hook is a pure function over Arrow data (no table reads, no clock: "now" is
passed in). ``None`` means the default, and the core then skips the work entirely, so
the default path costs nothing. ``hooks_for(sub)`` is the one place that picks a
subscription's hooks: issue 13 (filters, retry policy, ordering keys, dead letters)
fills them in there, and pull, ``subscribe()`` and the push job all follow at once.

A detached subscription (issue 14, ``delivery.detach``) has no delivery at all:
``require_attached`` raises ``SubscriptionDetached`` (a FailedPrecondition), and
``hooks_for`` asks it first, before anything is read or written. Every delivery path goes
through one of the two before it reads (pull and modify_deadline and the server's group
commit rounds through ``hooks_for``; acknowledge, which needs no hooks, directly), so they
all refuse it from here; the push job and the backlog leave detached subscriptions out first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SubscriptionDetached
from ..policy.filter_eval import compiled_filter
from ..policy.ordering import KeyState, eligible as ordering_eligible
from ..registry import SubscriptionRecord
from .attempt_limit import give_up_hook
from .retry_delay import due_hook, nack_hook

# rows (FANOUT_COLUMNS + attributes, read only for a filter) -> boolean mask: True = fan out;
# False = acked at once (never inserted).
FanoutFilter = Callable[[pa.Table], pa.Array]
# (rows nacked: message_id, delivery_attempt; now in seconds) -> lease_expires (us) per row.
RetryDelay = Callable[[pa.Table, float], pa.Array]
# now in seconds -> the filter of the deliveries rows due (available to lease) at now.
DueFilter = Callable[[float], pc.Expression]
# (available rows: STATE_COLUMNS + ordering_key, new messages: FANOUT_COLUMNS, each in
# lease order; the subscription's KeyState, held keys from selection.read_key_rows) ->
# (mask over available, mask over new): True = may be leased now.
Eligibility = Callable[[pa.Table, pa.Table, KeyState], tuple[pa.Array, pa.Array]]
# the attempt each candidate would get -> boolean mask: True = give up instead of leasing.
AttemptLimit = Callable[[pa.Array], pa.Array]


@dataclass(frozen=True, slots=True)
class DeliveryHooks:
    """A subscription's delivery policy.

    - ``keep``: the subscription's filter (issue 13); default keeps every message.
    - ``retry_delay``: the lease_expires a nack gets; default the NACKED sentinel
      (available again at once, told apart from a lease that ran out).
    - ``due``: which rows lease selection may take at ``now``; default never delivered,
      nacked, or past their deadline (``selection.available_filter``). With a retry policy
      a nacked or expired row waits its delay (``retry_delay.due_hook``).
    - ``eligible``: which candidates may be leased now, e.g. one outstanding message per
      ordering key; default all.
    - ``give_up``: which candidates reached the delivery-attempt limit and leave the
      subscription (dead letter) instead of being leased; default none.
    """

    keep: FanoutFilter | None = None
    retry_delay: RetryDelay | None = None
    due: DueFilter | None = None
    eligible: Eligibility | None = None
    give_up: AttemptLimit | None = None


DEFAULT_HOOKS = DeliveryHooks()


def require_attached(sub: SubscriptionRecord) -> None:
    """Raise SubscriptionDetached when `sub` was detached from its topic."""
    if sub.detached:
        raise SubscriptionDetached(sub.name)


def hooks_for(sub: SubscriptionRecord) -> DeliveryHooks:
    """The hooks of one subscription: each policy it carries sets its own; the rest keep
    the defaults (a subscription with no policy gets ``DEFAULT_HOOKS`` itself).
    Raises SubscriptionDetached for a detached subscription (see the module docstring)."""
    require_attached(sub)
    retry = sub.retry_policy
    hooks = DeliveryHooks(
        keep=compiled_filter(sub.filter) if sub.filter else None,
        retry_delay=None if retry is None else nack_hook(retry),
        due=None if retry is None else due_hook(retry),
        give_up=None if sub.dead_letter_policy is None else give_up_hook(sub.dead_letter_policy.max_delivery_attempts),
    )
    if sub.enable_message_ordering:  # issue 13 ordering keys: push holds one outstanding message per key
        hooks = replace(hooks, eligible=_ordering_hooks[sub.push_config.is_push])
    return DEFAULT_HOOKS if hooks == DEFAULT_HOOKS else hooks


def _pull_ordering(available: pa.Table, fresh: pa.Table, state: KeyState) -> tuple[pa.Array, pa.Array]:
    return ordering_eligible(available, fresh, state, one_per_key=False)


def _push_ordering(available: pa.Table, fresh: pa.Table, state: KeyState) -> tuple[pa.Array, pa.Array]:
    return ordering_eligible(available, fresh, state, one_per_key=True)


# Module-level functions (not closures), so hooks of equal subscriptions compare equal.
_ordering_hooks: dict[bool, Eligibility] = {False: _pull_ordering, True: _push_ordering}
