from deltabus.policy.leases import extension_seconds, next_pass_delay, over_max_lease, split_due
from deltabus.types import FlowControl


def test_extension_is_p99_within_bounds():
    assert extension_seconds(30, FlowControl()) == 30
    assert extension_seconds(300, FlowControl(max_duration_per_lease_extension=60)) == 60
    assert extension_seconds(10, FlowControl(min_duration_per_lease_extension=45)) == 45
    assert extension_seconds(5, FlowControl()) == 10
    assert extension_seconds(900, FlowControl()) == 600


def test_next_pass_lands_before_deadline():
    assert next_pass_delay(10, 0.0) == 0.01
    assert next_pass_delay(10, 0.9999) < 7.0
    assert 3 < next_pass_delay(10, 0.5) < 4


def test_leases_past_max_duration_are_dropped():
    held = {"a": 100.0, "b": 3000.0}
    assert over_max_lease(held, now=3801.0, max_lease_duration=3600) == ["a"]
    assert over_max_lease(held, now=3700.0, max_lease_duration=3600) == []


def test_split_due():
    assert split_due([("a", 5.0), ("b", 10.0), ("c", 11.0)], now=10.0) == ["a", "b"]
