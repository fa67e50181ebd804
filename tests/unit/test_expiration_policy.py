"""policy.expiration (pure) and the ExpirationPolicy type: plain asserts, time passed in."""

from __future__ import annotations

import datetime as dt

import pytest

from deltabus.errors import InvalidArgument
from deltabus.policy.expiration import RECORD_INTERVAL, expired, last_use, record_due
from deltabus.subscription_fields import parse_ttl
from deltabus.types import DAY, ExpirationPolicy

T0 = 1_800_000_000.0


def test_expired_counts_the_whole_ttl_from_the_last_use_or_the_creation() -> None:
    assert not expired(DAY, T0, None, T0 + DAY)  # exactly ttl unused: not yet
    assert expired(DAY, T0, None, T0 + DAY + 1)
    assert not expired(DAY, T0, T0 + 10 * 3600, T0 + DAY + 1)  # used 10 h after creation
    assert expired(DAY, T0, T0 + 10 * 3600, T0 + 10 * 3600 + DAY + 1)
    assert not expired(None, T0, None, T0 + 1000 * DAY)  # never
    assert last_use(T0, T0 - 5) == T0  # a use recorded before creation (clock skew) counts as creation


def test_a_use_is_recorded_at_most_once_per_interval() -> None:
    assert record_due(None, T0)
    assert not record_due(T0, T0 + RECORD_INTERVAL - 1)
    assert record_due(T0, T0 + RECORD_INTERVAL)
    assert RECORD_INTERVAL < DAY / 4  # small against the smallest ttl


def test_the_policy_takes_pubsubs_range_and_forms() -> None:
    assert ExpirationPolicy().ttl == 31 * DAY  # Pub/Sub's default
    assert ExpirationPolicy(dt.timedelta(days=2)).ttl == 2 * DAY
    assert ExpirationPolicy("86400s").ttl == DAY
    assert ExpirationPolicy(None).ttl is None  # never
    assert ExpirationPolicy.coerce(None) == ExpirationPolicy()  # not given: the default
    assert ExpirationPolicy.coerce({}) == ExpirationPolicy(None)  # empty policy: never, as in Pub/Sub
    assert ExpirationPolicy.coerce({"ttl": {"seconds": 172800}}).ttl == 2 * DAY
    for bad in (3600, 366 * DAY, -1, "soon", True):
        with pytest.raises(InvalidArgument, match=r"expiration_policy\.ttl"):
            ExpirationPolicy(bad)
    with pytest.raises(InvalidArgument, match=r"expiration_policy: unknown fields \['days'\]"):
        ExpirationPolicy.coerce({"days": 3})
    with pytest.raises(InvalidArgument, match="expiration_policy: must be"):
        ExpirationPolicy.coerce(3)


def test_the_cli_ttl_takes_units_and_never() -> None:
    import argparse

    assert parse_ttl("31d") == {"ttl": 31 * DAY}
    assert parse_ttl("36h") == {"ttl": 36 * 3600}
    assert parse_ttl("1440m") == {"ttl": DAY}
    assert parse_ttl("86400") == {"ttl": DAY}
    assert parse_ttl("never") == {"ttl": None}
    with pytest.raises(argparse.ArgumentTypeError, match="must be 'never' or a duration"):
        parse_ttl("a week")
    assert parse_ttl("2h") == {"ttl": 7200.0}  # the field's validator refuses it (it names the field)
