"""RetryPolicy and DeadLetterPolicy (issue 13): what a google-cloud-pubsub user may pass,
normalised, and the errors naming the field and the rule."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pyarrow as pa
import pytest

from deltabus import subscription_fields as sf
from deltabus.errors import InvalidArgument
from deltabus.registry import _sub_from_row, _sub_row
from deltabus.storage.tables import SUBSCRIPTIONS
from deltabus.types import DeadLetterPolicy, RetryPolicy, Subscription
from tests.unit.test_subscription_fields import record

DLT = "projects/p/topics/dead"


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, (10.0, 600.0)),
        ({"minimum_backoff": 5}, (5.0, 600.0)),
        ({"minimum_backoff": 0.5, "maximum_backoff": 2}, (0.5, 2.0)),
        ({"minimum_backoff": dt.timedelta(seconds=3), "maximum_backoff": dt.timedelta(minutes=1)}, (3.0, 60.0)),
        ({"minimum_backoff": {"seconds": 1, "nanos": 500_000_000}}, (1.5, 600.0)),
        ({"minimum_backoff": SimpleNamespace(seconds=2, nanos=0)}, (2.0, 600.0)),
        ({"minimum_backoff": "7.5s", "maximum_backoff": "30s"}, (7.5, 30.0)),
        ({"minimum_backoff": None, "maximum_backoff": 20}, (10.0, 20.0)),
        ({"minimum_backoff": 0, "maximum_backoff": 0}, (0.0, 0.0)),
        ({"minimum_backoff": 600, "maximum_backoff": 600}, (600.0, 600.0)),
    ],
)
def test_retry_policy_accepts_pubsub_shapes_and_normalises_to_seconds(given, expected):
    got = RetryPolicy.coerce(given)
    assert got is not None and (got.minimum_backoff, got.maximum_backoff) == expected
    assert type(got.minimum_backoff) is float and type(got.maximum_backoff) is float


@pytest.mark.parametrize(
    "given, field, rule",
    [
        ({"minimum_backoff": 900}, "retry_policy.minimum_backoff", "must be 0..600 seconds, got 900"),
        ({"maximum_backoff": -1}, "retry_policy.maximum_backoff", "must be 0..600 seconds, got -1"),
        # Only the maximum given: the error names it, not the minimum left at its default (issue 16).
        ({"maximum_backoff": 5}, "retry_policy.maximum_backoff", "must not be below the minimum backoff (10 s, its default"),
        ({"minimum_backoff": 20, "maximum_backoff": 5}, "retry_policy.minimum_backoff", "must not exceed maximum_backoff (5), got 20"),
        ({"minimum_backoff": True}, "retry_policy.minimum_backoff", "must be a duration"),
        ({"minimum_backoff": "ten"}, "retry_policy.minimum_backoff", "must be a duration"),
        ({"minimum_backoff": float("nan")}, "retry_policy.minimum_backoff", "finite"),
        ({"minimum_backoff": {"seconds": 1, "micros": 2}}, "retry_policy.minimum_backoff", "unknown fields ['micros']"),
        ({"minimum_backoff": {"seconds": 1.5}}, "retry_policy.minimum_backoff", "integers"),
        ({"min_backoff": 1}, "retry_policy", "unknown fields ['min_backoff']"),
        (5, "retry_policy", "must be a RetryPolicy, a dict or None"),
    ],
)
def test_bad_retry_policies_name_the_field_and_rule(given, field, rule):
    with pytest.raises(InvalidArgument) as e:
        RetryPolicy.coerce(given)
    assert e.value.field == field and rule in e.value.rule


def test_dead_letter_policy_defaults_and_errors():
    assert DeadLetterPolicy(DLT) == DeadLetterPolicy(DLT, 5) == DeadLetterPolicy.coerce({"dead_letter_topic": DLT, "max_delivery_attempts": 0})
    assert DeadLetterPolicy.coerce({"dead_letter_topic": DLT, "max_delivery_attempts": 100}) == DeadLetterPolicy(DLT, 100)
    assert DeadLetterPolicy.coerce(None) is None
    for given, field, rule in [
        ({"dead_letter_topic": DLT, "max_delivery_attempts": 4}, "dead_letter_policy.max_delivery_attempts", "must be 5..100, got 4"),
        ({"dead_letter_topic": DLT, "max_delivery_attempts": 101}, "dead_letter_policy.max_delivery_attempts", "must be 5..100, got 101"),
        ({"dead_letter_topic": DLT, "max_delivery_attempts": 5.0}, "dead_letter_policy.max_delivery_attempts", "must be an integer"),
        ({"dead_letter_topic": "dead"}, "dead_letter_policy.dead_letter_topic", "projects/PROJECT/topics/ID"),
        ({"max_delivery_attempts": 5}, "dead_letter_policy.dead_letter_topic", "is required"),
        ({"dead_letter_topic": DLT, "extra": 1}, "dead_letter_policy", "unknown fields ['extra']"),
    ]:
        with pytest.raises(InvalidArgument) as e:
            DeadLetterPolicy.coerce(given)
        assert (e.value.field, rule in e.value.rule) == (field, True), (given, e.value)


def test_subscription_coerce_takes_policies_as_dicts():
    got = Subscription.coerce({
        "name": "projects/p/subscriptions/s", "topic": "projects/p/topics/t",
        "retry_policy": {"minimum_backoff": 1}, "dead_letter_policy": {"dead_letter_topic": DLT},
    })
    assert got.retry_policy == RetryPolicy(1, 600) and got.dead_letter_policy == DeadLetterPolicy(DLT, 5)


def test_fields_version_2_is_the_three_policies_and_only_retry_and_dead_letter_update():
    assert [f.name for f in SUBSCRIPTIONS.layers[1]] == ["retry_policy", "dead_letter_policy", "filter"]
    assert {"retry_policy", "dead_letter_policy"} <= sf.UPDATABLE
    assert "filter" not in sf.UPDATABLE and "enable_message_ordering" not in sf.UPDATABLE


def test_policies_round_trip_through_the_table_and_old_rows_read_no_policy():
    rec = record(retry_policy=RetryPolicy(0.5, 2), dead_letter_policy=DeadLetterPolicy(DLT, 7), filter='attributes:x')
    table = pa.Table.from_pylist([_sub_row(rec)], schema=SUBSCRIPTIONS.schema)
    assert _sub_from_row(table.to_pylist()[0]) == rec
    row = _sub_row(rec)
    for name in ("retry_policy", "dead_letter_policy", "filter"):
        row.pop(name)
    old = _sub_from_row(row)
    assert (old.retry_policy, old.dead_letter_policy, old.filter) == (None, None, "")


def test_create_and_update_settings_of_the_policies():
    base = {"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"}
    got = sf.create_settings({**base, "retry_policy": {"maximum_backoff": 60}, "filter": "attributes:a"})
    assert (got.retry_policy, got.dead_letter_policy, got.filter) == (RetryPolicy(10, 60), None, "attributes:a")
    assert sf.create_settings(base).retry_policy is None
    with pytest.raises(InvalidArgument) as e:
        sf.create_settings({**base, "filter": "x" * 257})
    assert (e.value.field, e.value.rule) == ("filter", "must be at most 256 bytes, got 257")
    with pytest.raises(InvalidArgument) as e:
        sf.create_settings({**base, "filter": "é" * 129})  # 258 bytes in 129 characters
    assert e.value.rule == "must be at most 256 bytes, got 258"
    longest = 'attributes.k = "' + "x" * 239 + '"'  # a valid filter of exactly 256 bytes
    assert sf.create_settings({**base, "filter": longest}).filter == longest
    # A mask path with the field unset clears the policy.
    assert sf.update_changes({}, ["retry_policy", "dead_letter_policy"]) == {"retry_policy": None, "dead_letter_policy": None}
    with pytest.raises(InvalidArgument) as e:
        sf.update_changes({"retry_policy": {"minimum_backoff": 900}}, ["retry_policy"])
    assert str(e.value) == "retry_policy.minimum_backoff: must be 0..600 seconds, got 900"
