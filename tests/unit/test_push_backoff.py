import random

from deltabus.policy.push_backoff import MAX_DELAY, MIN_DELAY, PushBackoff


def test_first_nack_pauses_at_least_50ms_up_to_100ms():
    b = PushBackoff().after_round(acks=3, nacks=1, now=100.0, rand=0.0)
    assert b.delay == MIN_DELAY
    assert b.paused_until == 100.05
    assert not b.may_push(100.04) and b.may_push(100.05)
    assert PushBackoff().after_round(0, 1, 100.0, 0.999999).paused_until < 100.1 + 1e-9


def test_nacks_double_up_to_60s():
    b = PushBackoff()
    delays = []
    for _ in range(12):
        b = b.after_round(0, 5, now=0.0, rand=1.0)
        delays.append(b.delay)
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert delays[-1] == MAX_DELAY and max(delays) == MAX_DELAY


def test_successes_relax_and_end_backoff():
    b = PushBackoff(delay=0.8, paused_until=5.0)
    b = b.after_round(10, 0, now=6.0, rand=0.5)
    assert b.delay == 0.4
    b = b.after_round(10, 0, 6.1, 0.5).after_round(10, 0, 6.2, 0.5)
    assert b.delay == 0.1
    b = b.after_round(10, 0, 6.3, 0.5)
    assert b.delay == 0.0  # 0.1 halves below the minimum: no more backoff
    assert b.after_round(0, 0, 7.0, 0.5) == b  # no outcomes, no change


def simulate(nack_rate: float, seconds: float, tick: float = 0.5, seed: int = 7) -> list[float]:
    """Push one message whenever allowed, on a micro-batch cadence of `tick` seconds."""
    rng = random.Random(seed)
    b, now, sends = PushBackoff(), 0.0, []
    while now < seconds:
        if b.may_push(now):
            sends.append(now)
            nack = rng.random() < nack_rate
            b = b.after_round(0 if nack else 1, 1 if nack else 0, now, rng.random())
        now += tick
    return sends


def test_endpoint_that_nacks_everything_is_tried_every_30_to_60s():
    sends = simulate(1.0, 3600)
    gaps = [b - a for a, b in zip(sends, sends[1:])][-20:]  # once saturated
    assert all(30 <= g <= 60.5 for g in gaps), gaps


def test_endpoint_that_nacks_one_in_five_gets_pushes_about_every_half_second():
    sends = simulate(0.2, 600)
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    mean = sum(gaps) / len(gaps)
    assert 0.5 <= mean < 1.0, mean
