import pytest

from deltabus.errors import InvalidArgument
from deltabus.policy.pacing import CommitPacing, rate_after


def test_commits_every_batch_while_the_workers_are_short_of_work():
    p = CommitPacing()
    assert p.due(100.1, 100.0, queued=0, send_rate=0.0)
    assert p.due(100.1, 100.0, queued=3000, send_rate=5000.0)  # 0.6 s of work: under the low water


def test_waits_while_the_queue_is_deep_but_never_past_max_interval():
    p = CommitPacing(max_interval=1.0, low_water=0.75)
    assert not p.due(100.5, 100.0, queued=20_000, send_rate=7000.0)
    assert p.due(101.0, 100.0, queued=20_000, send_rate=7000.0)


def test_zero_max_interval_commits_every_batch():
    assert CommitPacing(max_interval=0).due(100.0, 100.0, queued=10**6, send_rate=1.0)


def test_rate_is_smoothed_and_ignores_empty_intervals():
    r = rate_after(0.0, 5000, 1.0)
    assert r == pytest.approx(1500.0)
    assert rate_after(r, 5000, 1.0) == pytest.approx(0.7 * 1500 + 1500)
    assert rate_after(r, 10, 0.0) == r


def test_bad_settings_name_the_field():
    with pytest.raises(InvalidArgument, match="max_interval"):
        CommitPacing(max_interval=-1)
    with pytest.raises(InvalidArgument, match="low_water"):
        CommitPacing(low_water=100)
