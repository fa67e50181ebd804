"""How long a message whose ``subscribe()`` callback raised waits before it is delivered again.

Pub/Sub's own client nacks such a message, and without a retry policy the server hands it
out again at once: a callback that fails on every message spins (measured here before this
policy: one message delivered 18 times in 3 s, a traceback each time). Until subscriptions
carry a retry policy, the streaming pull instead sets the message's ack deadline to a delay
that doubles with each delivery attempt, with jitter, so that a poison message costs a few
deliveries a minute rather than several a second, while a passing fault (a brief outage of
what the callback calls) is retried within a second or two.
"""

from __future__ import annotations

import math

from .backoff import Backoff

# 1 s for the first failed attempt, doubling to at most 60 s: a tenth of Pub/Sub's retry
# policy range (10..600 s), since without a policy Pub/Sub itself would not wait at all.
CALLBACK_ERROR_BACKOFF = Backoff(initial=1.0, maximum=60.0, multiplier=2.0)


def after_callback_error(delivery_attempt: int, rand: float, backoff: Backoff = CALLBACK_ERROR_BACKOFF) -> int:
    """Whole seconds (>= 1) until redelivery after the callback raised on `delivery_attempt`.

    Whole seconds so that the stream can send the deadlines of many failed messages in a
    few batched MERGEs (one per distinct value) rather than one each. `rand` is in [0, 1).
    """
    if delivery_attempt < 1:
        raise ValueError(f"delivery_attempt must be >= 1, got {delivery_attempt}")
    return max(1, math.ceil(backoff.delay(delivery_attempt - 1, rand)))
