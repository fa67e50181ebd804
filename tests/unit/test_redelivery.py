import pytest

from deltabus.policy.backoff import Backoff
from deltabus.policy.redelivery import after_callback_error


def test_delay_grows_with_each_delivery_attempt_up_to_a_minute():
    top = [after_callback_error(a, 0.999999) for a in range(1, 10)]
    assert top == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    low = [after_callback_error(a, 0.0) for a in range(1, 10)]
    assert low == [1, 1, 2, 4, 8, 16, 30, 30, 30]


def test_jitter_spreads_whole_seconds_between_half_and_full_ceiling():
    seen = {after_callback_error(5, r / 100) for r in range(100)}
    assert seen == set(range(8, 17))


def test_custom_backoff_and_bad_attempts():
    assert after_callback_error(3, 0.5, Backoff(initial=10, maximum=600)) == 30
    assert after_callback_error(10_000, 0.5) == 45  # no overflow for huge attempt counts
    with pytest.raises(ValueError):
        after_callback_error(0, 0.5)
