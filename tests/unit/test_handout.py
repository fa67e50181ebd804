import pytest

from deltabus.policy.handout import allocate


def test_fills_each_subscription_up_to_its_cap():
    assert allocate(["a", "b"], {"a": 1000, "b": 10}, {}, per_sub=512, limit=4096) == {"a": 512, "b": 10}
    assert allocate(["a"], {"a": 1000}, {"a": 500}, per_sub=512, limit=4096) == {"a": 12}


def test_a_full_subscription_gets_nothing_and_does_not_block_others():
    assert allocate(["slow", "fast"], {"slow": 50, "fast": 50}, {"slow": 512}, per_sub=512, limit=100) == {"fast": 50}
    assert allocate(["slow"], {"slow": 50}, {"slow": 600}, per_sub=512, limit=100) == {}


def test_limit_caps_one_hand_out_in_order():
    assert allocate(["a", "b", "c"], {"a": 300, "b": 300, "c": 300}, {}, per_sub=512, limit=500) == {"a": 300, "b": 200}
    assert allocate(["c", "a", "b"], {"a": 300, "b": 300, "c": 300}, {}, per_sub=512, limit=500) == {"c": 300, "a": 200}


def test_nothing_queued_gives_nothing():
    assert allocate(["a"], {}, {}, per_sub=1, limit=1) == {}


def test_rejects_non_positive_caps():
    with pytest.raises(ValueError):
        allocate(["a"], {"a": 1}, {}, per_sub=0, limit=1)


def test_pool_size_keeps_a_slot_for_micro_batches():
    from deltabus.errors import InvalidArgument
    from deltabus.push.pool import pool_size

    assert pool_size(2, 4) == 2
    assert pool_size(8, 4) == 3
    assert pool_size(2, 2) == 1
    with pytest.raises(InvalidArgument, match="spark.master.*at least 2 task slots"):
        pool_size(2, 1)
