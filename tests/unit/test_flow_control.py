from deltabus.policy import flow_control as fc
from deltabus.types import FlowControl

F = FlowControl(max_messages=10, max_bytes=1000)


def test_load_is_the_tighter_limit():
    assert fc.load(5, 100, F) == 0.5
    assert fc.load(1, 900, F) == 0.9


def test_pause_at_full_resume_below_80_percent():
    assert fc.next_paused(False, 9, 0, F) is False
    assert fc.next_paused(False, 10, 0, F) is True
    assert fc.next_paused(True, 9, 0, F) is True  # 90%: still paused
    assert fc.next_paused(True, 7, 0, F) is False


def test_room_and_dispatch():
    assert fc.room(3, F) == 7
    assert fc.room(12, F) == 0
    assert fc.may_dispatch(0, 0, 5000, F)  # a lone huge message still goes
    assert not fc.may_dispatch(1, 100, 950, F)
    assert fc.may_dispatch(1, 100, 900, F)
