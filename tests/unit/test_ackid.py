import pytest

from deltabus import InvalidArgument
from deltabus import ackid
from deltabus import ids


def test_round_trip():
    a = ackid.encode("s0123", "17000000000000000000000000000001", 3)
    assert ackid.decode(a) == ("s0123", "17000000000000000000000000000001", 3, None)  # the older format: any version
    for version in (0, 42, -1764000000000000):  # a fan-out version, or a seek's epoch
        b = ackid.encode("s0123", "17000000000000000000000000000001", 3, version)
        assert ackid.decode(b) == ("s0123", "17000000000000000000000000000001", 3, version)
        assert ackid.encode(*ackid.decode(b)) == b


@pytest.mark.parametrize("bad", ["", "abc", "s.1", "s.x.1", "s.1.y", "s.1.0", "s.1.²", f"s.1.{2**40}", "s/x.1.1", 5, None,
                                 "s.1.1.", "s.1.1.x", "s.1.1.--1", f"s.1.1.{10**21}", "s.1.1.2.3"])
def test_malformed(bad):
    with pytest.raises(InvalidArgument):
        ackid.decode(bad, "ack_ids[0]")


def test_message_ids_sort_by_time_then_index():
    a = ids.message_ids(ids.batch_prefix(1_000, nonce=99), 3)
    b = ids.message_ids(ids.batch_prefix(2_000, nonce=1), 1)
    assert a == sorted(a) and a[-1] < b[0]
    assert len(set(a + b)) == 4
    assert all(len(x) == 32 and x.isdigit() for x in a + b)
