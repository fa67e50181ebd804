"""When an idle push job's stream may skip a trigger (issue 18: an idle job costs nothing).

The push job's stream source makes a micro-batch on every trigger, so that lease expiries
and the ends of push backoff are acted on while nothing is published. An idle job (its last
batch found nothing outstanding in any of its subscriptions, pushed nothing, held no
outcome: ``DeliveryJob.idle``) has none of those to act on. Then nothing but a commit can
give it work: a publish (messages), a subscription created or changed (subscriptions), or
another writer's change to deliveries (a seek, a pull client's nack on a subscription made
push since). So after such a batch the job leaves an ``IdleHint`` naming those tables'
versions, and the source runs a batch only when one of them moved, the hint is older than
its ``recheck`` bound (housekeeping that is due by time alone: backlog figures, expiration
policies) or there is no hint.

Pure: the time and the versions seen are passed in.

Measured here (10 push subscriptions, no messages, ``--trigger-interval 0.5``): the idle
job ran two micro-batches a second and used 0.163 cores (JVM plus Python workers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# The tables whose commits can give an idle push job work (the module docstring).
WATCHED = ("messages", "subscriptions", "deliveries")


@dataclass(frozen=True, slots=True)
class IdleHint:
    """Left by an idle batch: the `versions` of the WATCHED tables after it, and the wall
    time (`at`) it was written. `recheck`: seconds after `at` a batch runs anyway."""

    versions: Mapping[str, int]
    at: float
    recheck: float

    def __post_init__(self) -> None:
        if not self.recheck > 0:
            raise ValueError(f"recheck: must be a positive number of seconds, got {self.recheck!r}")
        missing = [t for t in WATCHED if t not in self.versions]
        if missing:
            raise ValueError(f"versions: must name every watched table, missing {missing}")


def may_skip(hint: IdleHint | None, versions: Mapping[str, int], now: float) -> bool:
    """Whether a trigger may pass without a batch: the hint exists, none of its tables has
    a version other than the one it names (a table re-created goes back: that counts too;
    a table not in `versions` could not be read and counts as moved), and its recheck time
    has not come (nor is `now` before it was written: a clock stepped back)."""
    if hint is None:
        return False
    if not hint.at <= now < hint.at + hint.recheck:
        return False
    return all(versions.get(t) == v for t, v in hint.versions.items())
