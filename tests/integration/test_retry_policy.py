"""A subscription's retry policy on real Delta tables (issue 13): pull with an injected clock.

A nacked or expired message is due again only after delay(attempt) (policy/retry.py); no
policy means at once, as before. Short backoffs (fractions of a second) keep these fast.
"""

from __future__ import annotations

import time

import pytest

from deltabus import SubscriberClient
from deltabus.types import RetryPolicy
from tests.conftest import ManualClock


def make(csub: SubscriberClient, topic: str, name: str, policy: RetryPolicy | None, deadline: int = 10) -> str:
    path = csub.subscription_path("local", name)
    csub.create_subscription(request={"name": path, "topic": topic, "retry_policy": policy, "ack_deadline_seconds": deadline})
    return path


def pull(client, subscription):
    return client.pull(subscription=subscription, max_messages=10, return_immediately=True).received_messages


def nack(client, subscription, received):
    client.modify_ack_deadline(subscription=subscription, ack_ids=[r.ack_id for r in received], ack_deadline_seconds=0)


def test_a_nacked_message_waits_a_delay_growing_with_its_attempts(pub, csub, clock, topic):
    s = make(csub, topic, "retry-nack", RetryPolicy(1, 3))
    pub.publish_batch(topic, [{"data": b"x"}])
    for attempt, wait in [(1, 1.0), (2, 2.0), (3, 3.0), (4, 3.0)]:
        (got,) = pull(csub, s)
        assert got.delivery_attempt == attempt
        nack(csub, s, [got])
        clock.advance(wait - 0.01)
        assert pull(csub, s) == [], f"attempt {attempt}: redelivered before its {wait} s delay"
        clock.advance(0.01)
    (last,) = pull(csub, s)
    assert last.delivery_attempt == 5
    csub.acknowledge(subscription=s, ack_ids=[last.ack_id])
    assert pull(csub, s) == []


def test_an_expired_lease_also_waits_the_delay(pub, csub, clock, topic):
    s = make(csub, topic, "retry-expiry", RetryPolicy(2, 600), deadline=10)
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    first = pull(csub, s)
    assert len(first) == 2
    clock.advance(10 + 1.99)  # the lease ran out 1.99 s ago
    assert pull(csub, s) == []
    clock.advance(0.01)
    again = pull(csub, s)
    assert sorted(r.delivery_attempt for r in again) == [2, 2]
    clock.advance(10 + 3.99)  # attempt 2's delay is 4 s
    assert pull(csub, s) == []
    clock.advance(0.01)
    assert sorted(r.delivery_attempt for r in pull(csub, s)) == [3, 3]


def test_without_a_policy_redelivery_is_immediate(pub, csub, clock, topic):
    s = make(csub, topic, "no-retry", None, deadline=10)
    pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    a, b = pull(csub, s)
    nack(csub, s, [a])
    assert [r.delivery_attempt for r in pull(csub, s)] == [2]  # at once
    clock.advance(10)
    assert sorted(r.message.data for r in pull(csub, s)) == [b"x", b"y"]  # expiry: at once too


def test_an_extension_racing_a_delayed_nack_does_not_lease_the_message_again(pub, csub, clock, topic):
    s = make(csub, topic, "retry-race", RetryPolicy(1, 1))
    pub.publish_batch(topic, [{"data": b"x"}])
    (got,) = pull(csub, s)
    nack(csub, s, [got])
    # The same delivery's extension lands after the nack: it must not apply.
    csub.modify_ack_deadline(subscription=s, ack_ids=[got.ack_id], ack_deadline_seconds=60)
    clock.advance(1.0)
    (again,) = pull(csub, s)  # due after the retry delay, not held for 60 s
    assert again.delivery_attempt == 2


def test_clearing_the_policy_makes_waiting_messages_due_at_once(pub, csub, clock, topic):
    s = make(csub, topic, "retry-clear", RetryPolicy(60, 600))
    pub.publish_batch(topic, [{"data": b"x"}])
    nack(csub, s, pull(csub, s))
    assert pull(csub, s) == []
    backlog = csub.get_backlog(s)
    assert (backlog.num_outstanding_messages, backlog.expired_ack_deadlines) == (0, 1)  # shown as nacked, not leased
    csub.update_subscription(subscription={"name": s}, update_mask=["retry_policy"])
    assert [r.delivery_attempt for r in pull(csub, s)] == [2]


@pytest.mark.spark
@pytest.mark.cluster  # delta-spark MERGEs take seconds each on this machine
def test_on_delta_spark_a_delayed_nack_waits_and_refuses_a_racing_extension(spark, pub, sub, topic, warehouse, clock):
    """The engine-specific part: Spark's MERGE stores the negated due time (a timestamp
    before 1970), its DEADLINE clause refuses an extension of that row, and the due filter
    applies to what delta-spark reads."""
    from deltabus.storage import open_engine
    from tests.conftest import requires_delta

    requires_delta(spark)
    s = make(sub, topic, "spark-retry", RetryPolicy(1, 1))
    pub.publish_batch(topic, [{"data": b"x"}])
    client = SubscriberClient(engine=open_engine(warehouse, engine="delta-spark", spark=spark, create=False), clock=clock)
    try:
        (got,) = pull(client, s)
        nack(client, s, [got])
        client.modify_ack_deadline(subscription=s, ack_ids=[got.ack_id], ack_deadline_seconds=60)  # racing: refused
        clock.advance(0.99)
        assert pull(client, s) == []
        clock.advance(0.01)
        assert [r.delivery_attempt for r in pull(client, s)] == [2]
    finally:
        client.close()


def test_push_nacks_of_a_subscription_without_a_plan_still_get_its_retry_delay(pub, csub, clock, topic, warehouse):
    """A push job's held nacks for a subscription that is no longer pushed to (no plan in
    this batch) are merged with that subscription's retry delay, not at once."""
    import pyarrow as pa

    from deltabus.push import plan
    from deltabus.registry import Registry
    from deltabus.storage import open_engine
    from deltabus.storage.tables import DELIVERIES

    s = make(csub, topic, "push-held", RetryPolicy(5, 5))
    pub.publish_batch(topic, [{"data": b"x"}])
    (got,) = pull(csub, s)
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    rec = Registry(engine, clock=clock).subscription(s)
    nacks = pa.table({"message_id": [got.message.message_id], "delivery_attempt": pa.array([got.delivery_attempt], pa.int32())})
    empty = nacks.slice(0, 0)
    engine.transact(DELIVERIES.name, lambda snap: plan.execute(
        engine, snap, [], {rec.sub_uid: (empty, nacks)}, pa.table({}), 0, -1, now=clock(), batch_txn=None,
        records={rec.sub_uid: rec},
    ), what="test push batch")
    clock.advance(4.99)
    assert pull(csub, s) == []
    clock.advance(0.01)
    assert [r.delivery_attempt for r in pull(csub, s)] == [2]


def test_subscribe_nacks_on_a_callback_error_and_the_policy_delays_it(pub, csub, clock, topic, warehouse, caplog):
    """subscribe(): with a retry policy a raising callback's message is nacked (as Pub/Sub's
    client does) and waits the policy's delay, not the stream's own callback-error delay."""
    import logging

    s = make(csub, topic, "stream-retry", RetryPolicy(3, 3))
    [mid] = pub.publish_batch(topic, [{"data": b"x"}])
    calls: list[int] = []

    def callback(message):
        calls.append(message.delivery_attempt)
        raise ValueError("boom")

    caplog.set_level(logging.INFO, logger="deltabus.subscriber.streaming_pull")
    future = csub.subscribe(s, callback)
    with pytest.raises(ValueError, match="boom"):
        future.result(timeout=30)
    time.sleep(0.5)  # the stream runs on; the clock stands still, so nothing is due again
    assert calls == [1]
    future.cancel()
    other = SubscriberClient(warehouse=warehouse, clock=clock)
    try:
        clock.advance(2.99)  # the stream's own delay for attempt 1 would be 1 s
        assert pull(other, s) == []
        clock.advance(0.01)
        [again] = pull(other, s)
        assert (again.message.message_id, again.delivery_attempt) == (mid, 2)
    finally:
        other.close()
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "nacked: the retry policy delays it" in line
