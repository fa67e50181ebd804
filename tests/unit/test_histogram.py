from deltabus.policy.histogram import Histogram


def test_empty_histogram_answers_minimum():
    assert Histogram().percentile(99) == 10


def test_values_are_clamped_to_10_600():
    h = Histogram()
    h.add(0.2)
    h.add(10_000)
    assert h.percentile(0) == 10
    assert h.percentile(100) == 600


def test_p99_follows_the_slow_tail():
    h = Histogram()
    for _ in range(98):
        h.add(12)
    for _ in range(2):
        h.add(45.1)
    assert h.percentile(50) == 12
    assert h.percentile(98) == 12
    assert h.percentile(99) == 46
    assert len(h) == 100
