"""The retry policy's delay (policy/retry.py) and its two hooks (delivery/retry_delay.py),
on plain values and Arrow tables."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

from deltabus.delivery.hooks import DEFAULT_HOOKS, hooks_for
from deltabus.delivery.merge import NACKED_MAX_US, NACKED_US
from deltabus.delivery.retry_delay import due_hook, nack_hook
from deltabus.policy.retry import CAP_ATTEMPT, Step, delay, steps
from deltabus.timestamps import TS, to_us
from deltabus.types import RetryPolicy
from tests.unit.test_subscription_fields import record


def test_delay_doubles_from_the_minimum_up_to_the_maximum():
    default = RetryPolicy()
    assert [delay(default, n) for n in range(1, 10)] == [10, 20, 40, 80, 160, 320, 600, 600, 600]
    assert [delay(RetryPolicy(0.5, 3), n) for n in range(1, 6)] == [0.5, 1, 2, 3, 3]
    assert delay(RetryPolicy(7, 7), 1) == delay(RetryPolicy(7, 7), 50) == 7
    assert delay(RetryPolicy(0, 600), 1) == delay(RetryPolicy(0, 600), 30) == 0  # doubling zero stays zero
    assert delay(default, 10_000) == 600  # no float overflow for huge attempts
    assert delay(RetryPolicy(1e-300, 600), CAP_ATTEMPT) == 600
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        delay(default, 0)


@pytest.mark.parametrize("policy", [RetryPolicy(), RetryPolicy(0.5, 3), RetryPolicy(7, 7), RetryPolicy(0, 9),
                                    RetryPolicy(1e-6, 600), RetryPolicy(1e-300, 600), RetryPolicy(600, 600)])
def test_steps_cover_every_attempt_with_its_delay(policy):
    got = steps(policy)
    assert got[0].first == 1 and got[-1].last is None and len(got) <= CAP_ATTEMPT
    for a, b in zip(got, got[1:]):
        assert a.last is not None and b.first == a.last + 1
    for n in range(1, 200):
        (step,) = [s for s in got if s.first <= n and (s.last is None or n <= s.last)]
        assert step.seconds == delay(policy, n), n


def test_steps_of_the_default_policy():
    assert steps(RetryPolicy(10, 600)) == (
        Step(1, 1, 10), Step(2, 2, 20), Step(3, 3, 40), Step(4, 4, 80), Step(5, 5, 160), Step(6, 6, 320), Step(7, None, 600),
    )


def test_nack_hook_stores_the_negated_due_time_below_the_nacked_mark():
    now = 1_700_000_000.25
    nacked = pa.table({"message_id": ["a", "b", "c"], "delivery_attempt": pa.array([1, 3, 1], pa.int32())})
    got = nack_hook(RetryPolicy(0.5, 600))(nacked, now).to_pylist()
    assert got == [-to_us(now + 0.5), -to_us(now + 2.0), -to_us(now + 0.5)]
    assert all(v <= NACKED_MAX_US for v in got)


def rows(*specs: tuple[int, int | None]) -> pa.Table:
    """Deliveries rows of (delivery_attempt, lease_expires us)."""
    return pa.table({
        "message_id": [f"m{i}" for i in range(len(specs))],
        "delivery_attempt": pa.array([a for a, _ in specs], pa.int32()),
        "lease_expires": pa.array([le for _, le in specs], TS),
    })


def test_due_filter_waits_the_delay_after_a_nack_or_an_expiry():
    now = 1_700_000_000.0
    policy = RetryPolicy(1, 4)
    due = due_hook(policy)
    table = rows(
        (0, None),                       # m0 never delivered: due
        (1, NACKED_US),                  # m1 nacked before the policy: due at once
        (1, -to_us(now - 0.001)),        # m2 nacked, due a ms ago: due
        (1, -to_us(now + 0.5)),          # m3 nacked, due in 0.5 s: not yet
        (1, to_us(now - 1.0)),           # m4 attempt 1 expired 1 s ago, waits 1 s: due
        (1, to_us(now - 0.9)),           # m5 attempt 1 expired 0.9 s ago: not yet
        (2, to_us(now - 1.5)),           # m6 attempt 2 expired 1.5 s ago, waits 2 s: not yet
        (3, to_us(now - 4.0)),           # m7 attempt 3 expired 4 s ago, waits 4 s: due
        (9, to_us(now - 3.9)),           # m8 attempt 9 (capped at 4 s) expired 3.9 s ago: not yet
        (1, to_us(now + 5)),             # m9 leased, live: not due
    )
    got = table.filter(due(now))["message_id"].to_pylist()
    assert got == ["m0", "m1", "m2", "m4", "m7"]
    later = table.filter(due(now + 0.5))["message_id"].to_pylist()
    assert later == ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8"]


def test_hooks_for_sets_the_retry_hooks_only_with_a_policy():
    plain = record(enable_message_ordering=False)  # the shared record orders; ordering sets its own hook
    assert hooks_for(plain) is DEFAULT_HOOKS
    hooks = hooks_for(dataclasses.replace(plain, retry_policy=RetryPolicy(1, 2)))
    assert hooks.retry_delay is not None and hooks.due is not None
    assert (hooks.keep, hooks.eligible, hooks.give_up) == (None, None, None)
    assert hooks_for(dataclasses.replace(plain, retry_policy=RetryPolicy(1, 2))) == hooks  # values, not closures
