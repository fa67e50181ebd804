import pytest

from deltabus.errors import InvalidArgument
from deltabus.policy.stopping import StopSignals


def test_first_signal_stops_second_hurries_later_ones_change_nothing():
    s = StopSignals().after("SIGTERM", 100.0)
    assert (s.stage, s.first_name) == ("stopping", "SIGTERM")
    s = s.after("SIGTERM", 105.0)
    assert s.stage == "hurrying"
    assert s.after("SIGTERM", 110.0).stage == "hurrying"
    assert s.after("SIGTERM", 110.0).first_name == "SIGTERM"


def test_one_ctrl_c_reaching_the_jvm_and_the_python_driver_counts_once():
    s = StopSignals().after("SIGINT", 100.0).after("SIGINT", 100.01)
    assert s.stage == "stopping"
    assert s.after("SIGINT", 102.0).stage == "hurrying"  # pressed again


def test_a_different_signal_right_after_counts():
    s = StopSignals().after("SIGINT", 100.0).after("SIGTERM", 100.1)
    assert (s.stage, s.first_name) == ("hurrying", "SIGINT")


def test_the_window_is_measured_from_the_last_signal_counted():
    s = StopSignals(same_within=1.0).after("SIGINT", 100.0)
    s = s.after("SIGINT", 100.9)  # a duplicate: ignored, and does not extend the window
    assert s.after("SIGINT", 101.05).stage == "hurrying"


def test_window_is_validated():
    with pytest.raises(InvalidArgument) as e:
        StopSignals(same_within=-1)
    assert e.value.field == "same_within"
