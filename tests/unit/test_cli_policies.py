"""The CLI's delivery-policy flags (issue 13): --min-backoff/--max-backoff,
--dead-letter-topic/--max-delivery-attempts, --clear-*, --filter, --enable-message-ordering."""

from __future__ import annotations

import pytest

from deltabus import cli
from deltabus.errors import InvalidArgument


def parse(*argv: str):
    return cli.build_parser().parse_args(["--project", "p", *argv])


def test_backoff_flags_make_a_retry_policy_the_other_defaulting():
    args = parse("subscriptions", "create", "sub-1", "--topic", "t-1", "--min-backoff", "0.5")
    assert cli._policy_flags(args) == {"retry_policy": {"minimum_backoff": 0.5}}
    args = parse("subscriptions", "update", "sub-1", "--max-backoff", "30")
    assert cli._policy_flags(args) == {"retry_policy": {"maximum_backoff": 30.0}}
    args = parse("subscriptions", "create", "sub-1", "--topic", "t-1")
    assert cli._policy_flags(args) == {}


def test_dead_letter_flags_and_clearing():
    args = parse("subscriptions", "create", "sub-1", "--topic", "t-1", "--dead-letter-topic", "dead", "--max-delivery-attempts", "9")
    assert cli._policy_flags(args) == {"dead_letter_policy": {"dead_letter_topic": "projects/p/topics/dead", "max_delivery_attempts": 9}}
    args = parse("subscriptions", "update", "sub-1", "--clear-retry-policy", "--clear-dead-letter-policy")
    assert cli._policy_flags(args) == {"retry_policy": None, "dead_letter_policy": None}


@pytest.mark.parametrize(
    "argv, field, words",
    [
        (["update", "sub-1", "--clear-retry-policy", "--min-backoff", "1"], "--clear-retry-policy", "cannot be given with"),
        (["update", "sub-1", "--clear-dead-letter-policy", "--dead-letter-topic", "d"], "--clear-dead-letter-policy", "cannot be given"),
        (["create", "sub-1", "--topic", "t-1", "--max-delivery-attempts", "7"], "--max-delivery-attempts", "needs --dead-letter-topic"),
        (["create", "sub-1", "--topic", "t-1", "--max-backoff", "601"], "retry_policy.maximum_backoff", "must be 0..600 seconds, got 601"),
        (["create", "sub-1", "--topic", "t-1", "--dead-letter-topic", "d-1", "--max-delivery-attempts", "101"],
         "dead_letter_policy.max_delivery_attempts", "must be 5..100, got 101"),
    ],
)
def test_bad_policy_flags_are_refused_before_anything_opens(argv, field, words):
    with pytest.raises(InvalidArgument) as e:
        cli._policy_flags(parse("subscriptions", *argv))
    assert e.value.field == field and words in e.value.rule


def test_filter_and_ordering_are_create_only_flags(capsys):
    create = parse("subscriptions", "create", "sub-1", "--topic", "t-1", "--filter", "attributes:a", "--enable-message-ordering")
    assert cli._field_flag_values(create) == {"filter": "attributes:a", "enable_message_ordering": True}
    assert cli._field_flag_values(parse("subscriptions", "create", "sub-1", "--topic", "t-1")) == {}
    for flag in ("--filter", "--enable-message-ordering"):
        assert cli.main(["subscriptions", "update", "sub-1", flag, "x"]) == 1
        assert "unrecognized arguments" in capsys.readouterr().err
