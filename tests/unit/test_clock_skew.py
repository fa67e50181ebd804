"""The storage-clock estimate (policy/clock_skew.py): pure asserts, time passed in."""

from __future__ import annotations

import pytest

from deltabus.errors import ClockUncertain, InvalidArgument
from deltabus.policy.clock_skew import (
    COARSE_GRANULARITY,
    ClockSkewPolicy,
    Estimate,
    Interval,
    bounds,
    combine,
    current,
    granularity_of,
    observed,
    refusal,
    stepped,
    usable,
)

P = ClockSkewPolicy(granularity=0.01, drift=0.0, refresh_seconds=10.0, max_uncertainty=1.0, step_tolerance=0.002)


def test_one_observation_brackets_the_offset() -> None:
    # A clock 30 s ahead: the write happened at local 1030.000..1030.004, stamped 1000.001 (storage).
    got = observed(before=1030.000, after=1030.004, stamp=1000.001, granularity=0.01)
    assert got.low == pytest.approx(-30.003)  # stamp - after
    assert got.high == pytest.approx(-29.989)  # stamp + granularity - before
    assert got.low <= -30.0 <= got.high


def test_the_true_offset_is_inside_whatever_the_stamp_lag() -> None:
    true_offset = 12.5
    for write_local, lag in [(100.0, 0.0), (100.002, 0.009), (100.004, 0.004)]:
        stamp = write_local + true_offset - lag  # the stamp lags the write by up to the granularity
        got = observed(99.999, 100.005, stamp, 0.01)
        assert got.low <= true_offset <= got.high


def test_after_before_before_is_refused() -> None:
    with pytest.raises(ValueError):
        observed(2.0, 1.0, 5.0, 0.01)


def test_observations_intersect_to_the_narrowest_interval() -> None:
    est, restarted = combine(None, Interval(-30.010, -29.990), local=1030.0, mono=1.0, policy=P)
    assert restarted and est.offset == Interval(-30.010, -29.990)
    est, restarted = combine(est, Interval(-30.002, -29.980), local=1031.0, mono=2.0, policy=P)
    assert not restarted
    assert est.offset == pytest.approx(Interval(-30.002, -29.990))
    assert est.observations == 2 and est.at == 2.0


def test_drift_widens_an_estimate_as_it_ages() -> None:
    policy = ClockSkewPolicy(drift=500e-6)
    est = Estimate(Interval(-1.0, -0.99), at=100.0, local_minus_mono=0.0)
    assert bounds(est, 100.0, policy.drift) == Interval(-1.0, -0.99)
    aged = bounds(est, 110.0, policy.drift)  # 10 s: +-5 ms
    assert aged.low == pytest.approx(-1.005) and aged.high == pytest.approx(-0.985)
    assert bounds(est, 90.0, policy.drift) == Interval(-1.0, -0.99)  # never narrowed by a clock going back


def test_a_disjoint_observation_starts_again() -> None:
    est = Estimate(Interval(-30.01, -29.99), at=1.0, local_minus_mono=1029.0)
    est2, restarted = combine(est, Interval(4.99, 5.01), local=1031.0, mono=2.0, policy=P)
    assert restarted and est2.offset == Interval(4.99, 5.01) and est2.observations == 1


def test_a_step_of_the_local_clock_starts_again_and_makes_the_estimate_unusable() -> None:
    est = Estimate(Interval(-0.01, 0.01), at=10.0, local_minus_mono=1000.0)
    assert not stepped(est, local=1015.0, mono=15.0, policy=P)  # time passed, no step
    assert stepped(est, local=1075.0, mono=15.0, policy=P)  # set 60 s ahead
    assert usable(est, 1075.0, 15.0, P) is None and current(est, 1075.0, 15.0, P) is None
    est2, restarted = combine(est, Interval(-60.01, -59.99), local=1075.0, mono=15.0, policy=P)
    assert restarted and est2.local_minus_mono == 1060.0


def test_a_stale_estimate_asks_for_a_probe_but_stays_usable() -> None:
    est = Estimate(Interval(-0.01, 0.01), at=0.0, local_minus_mono=0.0)
    assert current(est, 5.0, 5.0, P) == Interval(-0.01, 0.01)
    assert current(est, 11.0, 11.0, P) is None  # older than refresh_seconds: read the storage again
    assert usable(est, 11.0, 11.0, P) == Interval(-0.01, 0.01)
    assert current(None, 0.0, 0.0, P) is None


def test_whole_second_stamps_get_the_coarse_granularity() -> None:
    assert granularity_of(1_795_710_898_951_852_538, 0.02) == 0.02
    assert granularity_of(1_795_710_898_000_000_000, 0.02) == COARSE_GRANULARITY


def test_refusal_names_the_offset_the_uncertainty_and_the_bound() -> None:
    assert refusal(Interval(-30.01, -29.99), P) is None
    reason = refusal(Interval(-31.0, -29.0), P)
    assert reason is not None
    assert "30.000 s ahead of the storage's" in reason and "±1.000 s" in reason and "max_uncertainty" in reason
    assert "behind" in (refusal(Interval(29.0, 31.0), P) or "")
    assert issubclass(ClockUncertain, Exception)


def test_the_guarantee_two_clocks_60_s_apart_never_judge_a_lease_early() -> None:
    """Lease granted at `latest + d` by A, judged with B's `earliest`: B sees it expired only
    once d seconds of storage time have passed, whatever A's and B's clocks say."""
    d, storage_grant = 10.0, 1000.0
    a_skew, b_skew = +30.0, -30.0
    a = observed(storage_grant + a_skew - 0.003, storage_grant + a_skew + 0.002, storage_grant - 0.004, 0.01)
    b = observed(storage_grant + b_skew - 0.001, storage_grant + b_skew + 0.006, storage_grant - 0.001, 0.01)
    lease_end = (storage_grant + a_skew) + a.high + d  # A's latest + d
    for storage_now in [storage_grant + d - 0.5, storage_grant + d - 0.001]:
        b_earliest = (storage_now + b_skew) + b.low
        assert b_earliest < lease_end  # still running for B
    b_earliest = (storage_grant + d + a.width + b.width + 0.001 + b_skew) + b.low
    assert b_earliest >= lease_end  # expired for B at most both widths after its true end


def test_policy_bounds_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="clock_skew.max_uncertainty"):
        ClockSkewPolicy(max_uncertainty=0)
    with pytest.raises(InvalidArgument, match="clock_skew.drift"):
        ClockSkewPolicy(drift=0.5)
    with pytest.raises(InvalidArgument, match="clock_skew.refresh_seconds"):
        ClockSkewPolicy(refresh_seconds=0)
