"""The pure parts of dead-lettering (issue 13): the attempt limit, the copy's id and
attributes, and marking a decision's GIVE_UP rows with the move's key."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from deltabus import ackid
from deltabus.delivery import dead_letter
from deltabus.delivery.attempt_limit import give_up_hook
from deltabus.delivery.merge import source_rows
from deltabus.delivery.model import Op
from deltabus.push.body import rfc3339
from deltabus.timestamps import TS, to_us


def test_the_attempt_limit_gives_up_only_above_max():
    hook = give_up_hook(5)
    attempts = pa.array([1, 5, 6, 7, None], pa.int32())
    assert hook(attempts).to_pylist() == [False, False, True, True, False]


def test_the_copy_id_is_deterministic_digits_an_ack_id_accepts_and_differs_per_subscription_and_key():
    mid = "17954708394085900000123400000001"
    one = dead_letter.dead_letter_id("s1", mid, 7)
    assert one == dead_letter.dead_letter_id("s1", mid, 7)  # a rerun builds the same row
    assert one.isdigit() and len(one) == 40 and one.startswith(mid[:16])
    assert one[16:24] == dead_letter.sub_tag("s1")
    assert len({one, dead_letter.dead_letter_id("s2", mid, 7), dead_letter.dead_letter_id("s1", mid, 8)}) == 3
    assert ackid.decode(ackid.encode("s9", one, 1)).message_id == one


@pytest.mark.parametrize("us", [0, 1_700_000_000_000_000, 1_700_000_000_123_000, 1_700_000_000_123_456])
def test_the_source_publish_time_is_rfc3339_as_push_bodies_write_it(us):
    when = dt.datetime.fromtimestamp(us / 1e6, tz=dt.timezone.utc)
    assert dead_letter.rfc3339_us(us) == rfc3339(when)


def test_the_four_attributes():
    attrs = dead_letter.source_attributes("projects/proj-1/subscriptions/orders-sub", 5, to_us(1_700_000_000.5))
    assert attrs == {
        "CloudPubSubDeadLetterSourceDeliveryCount": "5",
        "CloudPubSubDeadLetterSourceSubscription": "orders-sub",
        "CloudPubSubDeadLetterSourceSubscriptionProject": "proj-1",
        "CloudPubSubDeadLetterSourceTopicPublishTime": "2023-11-14T22:13:20.500Z",
    }


def test_with_key_marks_give_up_rows_only():
    rows = pa.table({"message_id": ["a", "b"], "delivery_attempt": pa.array([5, 5], pa.int32())})
    give_up = source_rows(Op.GIVE_UP, "s1", rows, rows["delivery_attempt"], pa.nulls(2, TS))
    lease = source_rows(Op.LEASE, "s1", rows, rows["delivery_attempt"], pa.nulls(2, TS))
    marked = dead_letter.with_key([give_up, lease], 42)
    assert marked[0]["dead_letter_key"].to_pylist() == [42, 42]
    assert marked[1]["dead_letter_key"].to_pylist() == [None, None]
    assert give_up["dead_letter_key"].to_pylist() == [None, None]  # pure: the input is unchanged
