import pytest

from deltabus import InvalidArgument
from deltabus.policy.backoff import Backoff


def test_ceiling_grows_exponentially_to_cap():
    b = Backoff(initial=0.1, maximum=60, multiplier=2)
    assert [b.ceiling(i) for i in range(4)] == [0.1, 0.2, 0.4, 0.8]
    assert b.ceiling(100) == 60
    assert b.ceiling(10_000) == 60  # no overflow


def test_jitter_within_half_to_full_ceiling():
    b = Backoff(initial=1, maximum=8)
    assert b.delay(3, 0.0) == 4
    assert b.delay(3, 0.999999) == pytest.approx(8, rel=1e-5)


def test_rejects_bad_settings():
    with pytest.raises(InvalidArgument):
        Backoff(initial=0)
    with pytest.raises(InvalidArgument):
        Backoff(initial=1, maximum=0.5)
    with pytest.raises(ValueError):
        Backoff().ceiling(-1)
