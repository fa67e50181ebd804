from deltabus.policy.lease_start import MARGIN, WINDOW, CommitTimes, allowance


def test_the_longest_allowance_before_a_commit_is_timed() -> None:
    assert allowance([], 10.0) == 10.0
    assert CommitTimes().allowance(600.0) == 600.0


def test_the_longest_recent_commit_with_a_margin_capped_at_one_deadline() -> None:
    assert allowance([0.02, 0.05, 0.01], 10.0) == 0.05 * MARGIN
    assert allowance([3.0, 25.0], 10.0) == 10.0
    assert allowance([0.0], 10.0) == 0.0


def test_only_the_last_commits_count() -> None:
    times = CommitTimes()
    times.add(8.0)
    for _ in range(WINDOW):
        times.add(0.1)
    assert times.allowance(600.0) == 0.1 * MARGIN
    times.add(-1.0)  # a clock step back counts as an instant commit
    assert times.allowance(600.0) == 0.1 * MARGIN
