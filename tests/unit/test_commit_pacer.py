"""When the push job commits: every batch at light load, paced while the workers hold plenty."""

from deltabus.policy.pacing import CommitPacing
from deltabus.push.commit_pacer import CommitPacer


def test_light_load_commits_every_batch():
    p = CommitPacer(CommitPacing(max_interval=1.0, low_water=0.75), now=0.0)
    assert p.commit_now(0.1, settled=0, queued=0)
    assert p.commit_now(0.2, settled=0, queued=0)


def test_a_full_queue_defers_until_max_interval_and_a_drain_always_commits():
    p = CommitPacer(CommitPacing(max_interval=1.0, low_water=0.75), now=0.0)
    assert p.commit_now(0.5, settled=100, queued=0)  # commits; rate now 0.3 * 200/s = 60/s
    assert 59.9 < p.send_rate < 60.1
    assert not p.commit_now(1.0, settled=100, queued=10_000)  # 10k queued >> 0.75 s of sending
    assert not p.commit_now(1.4, settled=100, queued=10_000)
    assert p.commit_now(1.5, settled=100, queued=10_000)  # a second since the last commit
    assert not p.commit_now(1.6, settled=0, queued=10_000)
    assert p.commit_now(1.7, settled=0, queued=10_000, forced=True)
    assert not p.commit_now(1.8, settled=0, queued=10_000)  # the forced commit counts as the last one
