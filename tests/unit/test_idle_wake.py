"""policy.idle_wake: when an idle push job's stream may skip a trigger."""

from __future__ import annotations

import pytest

from deltabus.policy.idle_wake import WATCHED, IdleHint, may_skip

V = {"messages": 7, "subscriptions": 3, "deliveries": 40}


def hint(at: float = 100.0, recheck: float = 10.0, **versions: int) -> IdleHint:
    return IdleHint({**V, **versions}, at, recheck)


def test_no_hint_never_skips() -> None:
    assert not may_skip(None, V, 100.0)


def test_nothing_moved_within_recheck_skips() -> None:
    assert may_skip(hint(), V, 100.0)
    assert may_skip(hint(), V, 109.99)


def test_recheck_time_runs_a_batch() -> None:
    assert not may_skip(hint(), V, 110.0)
    assert not may_skip(hint(), V, 500.0)


def test_a_clock_stepped_back_runs_a_batch() -> None:
    assert not may_skip(hint(), V, 99.0)


@pytest.mark.parametrize("table", WATCHED)
def test_any_watched_table_moving_runs_a_batch(table: str) -> None:
    assert not may_skip(hint(), {**V, table: V[table] + 1}, 101.0)


def test_a_table_recreated_or_unreadable_runs_a_batch() -> None:
    assert not may_skip(hint(), {**V, "deliveries": 0}, 101.0)  # went back
    assert not may_skip(hint(), {k: v for k, v in V.items() if k != "subscriptions"}, 101.0)  # not read


def test_a_hint_must_name_every_table_and_a_positive_recheck() -> None:
    with pytest.raises(ValueError, match="versions"):
        IdleHint({"messages": 1}, 0.0, 10.0)
    with pytest.raises(ValueError, match="recheck"):
        IdleHint(V, 0.0, 0.0)
