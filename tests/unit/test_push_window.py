from deltabus.policy.push_window import MAX_WINDOW, SLOW_START_LIMIT, START, PushWindow


def test_starts_at_three():
    assert PushWindow().limit == START == 3
    assert PushWindow().room(outstanding=2) == 1
    assert PushWindow().room(outstanding=5) == 0


def test_slow_start_doubles_per_fully_acked_round_up_to_3000():
    w = PushWindow()
    sizes = []
    for _ in range(12):
        w = w.after_round(acks=w.limit, nacks=0, mean_latency=0.05)
        sizes.append(w.limit)
    assert sizes[:5] == [6, 12, 24, 48, 96]
    i = next(k for k, v in enumerate(sizes) if v >= SLOW_START_LIMIT)  # exponential up to 3,000...
    assert sizes[i - 1] < SLOW_START_LIMIT <= sizes[i] < 2 * SLOW_START_LIMIT
    assert sizes[i + 1] - sizes[i] == 3000  # ...then linear: +3,000 per fully acked window


def test_linear_growth_past_3000_while_healthy():
    w = PushWindow(size=SLOW_START_LIMIT, avg_latency=0.05, ack_ratio=1.0)
    w1 = w.after_round(3000, 0, 0.05)
    w2 = w1.after_round(6000, 0, 0.05)
    assert (w1.limit - w.limit, w2.limit - w1.limit) == (3000, 3000)
    # The same acks split over several micro-batches grow it about the same (within 10%).
    split = PushWindow(size=6000, avg_latency=0.05, ack_ratio=1.0)
    for _ in range(6):
        split = split.after_round(1000, 0, 0.05)
    assert 8100 < split.limit <= 9000
    assert PushWindow(size=6000, avg_latency=0.05, ack_ratio=1.0).after_round(600, 0, 0.05).limit == 6300
    big = PushWindow(size=MAX_WINDOW, avg_latency=0.05, ack_ratio=1.0).after_round(30000, 0, 0.05)
    assert big.limit == MAX_WINDOW


def test_nacks_shrink_the_window_in_proportion():
    assert PushWindow(size=100).after_round(acks=0, nacks=100, mean_latency=0.1).limit == 50  # all nacked: halved
    assert PushWindow(size=100).after_round(acks=90, nacks=10, mean_latency=0.1).limit == 185  # +90 acks, -5
    assert PushWindow(size=100).after_round(acks=30, nacks=70, mean_latency=0.1).limit == 95  # mostly failing: shrinks
    assert PushWindow(size=1).after_round(0, 1, 0.1).limit == 1


def test_slow_or_unreliable_endpoint_falls_back_to_3000():
    slow = PushWindow(size=9000, avg_latency=0.2, ack_ratio=1.0)
    for _ in range(5):
        slow = slow.after_round(acks=100, nacks=0, mean_latency=3.0)
    assert slow.limit == SLOW_START_LIMIT
    flaky = PushWindow(size=9000, avg_latency=0.1, ack_ratio=0.97).after_round(100, 0, 0.1)
    assert flaky.limit <= SLOW_START_LIMIT


def test_pushes_that_expired_before_being_sent_halve_the_window():
    # Our own sending fell behind the window: shrink it fast, whatever the endpoint said.
    w = PushWindow(size=3000, avg_latency=0.05, ack_ratio=1.0).after_round(acks=2000, nacks=100, mean_latency=0.05, expired=100)
    assert w.limit == (3000 - 50) // 2
