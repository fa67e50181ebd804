"""Subscription expiration (Pub/Sub's ``ExpirationPolicy``): pure rules, time passed in.

A subscription is used by a pull, an ack, a deadline change or a push; unused for its
policy's ``ttl`` it expires, and maintenance deletes it. Use is recorded in the
subscriptions table at most once per RECORD_INTERVAL per process (``activity``): every pull
writing a row would add a commit to the registry per pull, and readers of the registry
would reload it each time. The interval is small against the smallest ttl (one day), so a
subscription in use never looks unused for longer than RECORD_INTERVAL.
"""

from __future__ import annotations

RECORD_INTERVAL = 3600.0  # seconds between two records of one subscription's use, per process


def record_due(last_recorded: float | None, now: float, interval: float = RECORD_INTERVAL) -> bool:
    """Whether a use at `now` must be written, the last one written being at `last_recorded`
    (None: never by this process and none on the record)."""
    return last_recorded is None or now - last_recorded >= interval


def last_use(created: float, last_active: float | None) -> float:
    """When the subscription was last used: its last recorded use, else its creation."""
    return created if last_active is None else max(created, last_active)


def expired(ttl: float | None, created: float, last_active: float | None, now: float) -> bool:
    """Whether a subscription with this policy ttl (None: never), created at `created` and
    last recorded in use at `last_active`, has expired at `now`. The ttl is counted in full:
    a subscription used exactly ttl seconds ago has not expired."""
    return ttl is not None and now - last_use(created, last_active) > ttl
