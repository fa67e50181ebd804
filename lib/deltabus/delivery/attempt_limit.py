"""The dead-letter policy's hook: which lease candidates reached the delivery-attempt limit.

Contract: ``give_up_hook(max)`` is ``DeliveryHooks.give_up`` for a subscription whose
dead-letter policy allows ``max`` deliveries: True where the attempt a candidate would get
is above ``max``, so exactly ``max`` deliveries happen before the message is given up
(``delivery/dead_letter`` then moves it). Pure.
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["give_up_hook"]


def give_up_hook(max_delivery_attempts: int) -> Callable[[pa.Array], pa.Array]:
    """True where the next attempt (an int32 array) would exceed `max_delivery_attempts`."""
    limit = pa.scalar(int(max_delivery_attempts), pa.int32())

    def give_up(attempts: pa.Array) -> pa.Array:
        return pc.fill_null(pc.greater(attempts, limit), False)

    return give_up
