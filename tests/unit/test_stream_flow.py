"""policy.stream_flow: what a StreamingPull stream has outstanding and how much more it may get."""

import pytest

from deltabus.policy.stream_flow import UNLIMITED_BATCH, StreamFlow


def test_message_limit_counts_outstanding_until_settled():
    f = StreamFlow(max_messages=3)
    assert f.room() == 3
    f.leased("a", 10, until=100.0)
    f.leased("b", 10, until=100.0)
    assert f.room() == 1 and f.count == 2 and f.bytes == 20
    assert f.settled("a")
    assert not f.settled("a")  # a second ack of the same id frees nothing more
    assert f.room() == 2 and f.bytes == 10


def test_byte_limit_stops_at_or_past_the_limit():
    f = StreamFlow(max_messages=100, max_bytes=25)
    f.leased("a", 20, until=100.0)
    assert f.room() == 99
    f.leased("b", 20, until=100.0)  # past the limit: the batch that crossed it is allowed (soft)
    assert f.room() == 0
    f.settled("b")
    assert f.room() == 99


def test_no_limits_ask_in_batches():
    f = StreamFlow()
    for i in range(5000):
        f.leased(str(i), 1_000_000, until=1.0)
    assert f.room() == UNLIMITED_BATCH


def test_run_out_leases_stop_counting_and_extensions_keep_them():
    f = StreamFlow(max_messages=2)
    f.leased("a", 1, until=10.0)
    f.leased("b", 1, until=10.0)
    assert f.extended("b", until=50.0)
    assert not f.extended("zz", until=50.0)
    assert f.expire(9.9) == []
    assert f.expire(10.0) == ["a"]
    assert f.room() == 1 and f.ack_ids() == ["b"]
    assert f.expire(60.0) == ["b"] and f.room() == 2 and f.bytes == 0


def test_releasing_the_same_ack_id_replaces_its_size():
    f = StreamFlow(max_messages=5)
    f.leased("a", 7, until=1.0)
    f.leased("a", 3, until=2.0)
    assert f.count == 1 and f.bytes == 3


def test_negative_limits_are_refused():
    with pytest.raises(ValueError, match="max_outstanding_messages"):
        StreamFlow(max_messages=-1)
    with pytest.raises(ValueError, match="max_outstanding_bytes"):
        StreamFlow(max_bytes=-5)
