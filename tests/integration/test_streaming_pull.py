import logging
import threading
import time

import pytest

from deltabus import NotFound, SubscriberClient
from deltabus.types import FlowControl
from tests.background import Warehouse, start_selected
from tests.conftest import ManualClock


class Gate:
    """A callback that holds each message until released, tracking how many it holds at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.active = 0
        self.peak = 0
        self.done: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, message) -> None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        self.release.wait(30)
        with self._lock:
            self.active -= 1
            self.done.append(message.message_id)
        message.ack()


def wait_for(predicate, timeout=30.0, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def test_subscribe_delivers_and_acks_everything(pub, sub, topic, subscription):
    ids = set(pub.publish_batch(topic, [{"data": f"{i}".encode(), "attributes": {"i": str(i)}} for i in range(300)]))
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def callback(message):
        assert message.data.decode() == message.attributes["i"]
        with lock:
            seen[message.message_id] = seen.get(message.message_id, 0) + 1
        message.ack()

    future = sub.subscribe(subscription, callback)
    assert wait_for(lambda: set(seen) == ids)
    future.cancel()
    assert future.result(timeout=30) is True and future.cancelled()
    assert set(seen.values()) == {1}
    assert wait_for(lambda: sub.get_backlog(subscription).num_unacked_messages == 0)


def lease_is_extended_while_processing_outlasts_deadline(pub, sub, topic, warehouse):
    s = sub.subscription_path("local", "slow")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=10)
    pub.publish_batch(topic, [{"data": b"slow work"}])
    deliveries = []
    done = threading.Event()

    def callback(message):
        deliveries.append((message.message_id, message.delivery_attempt))
        time.sleep(16)  # well past the 10 s ack deadline
        message.ack()
        done.set()

    future = sub.subscribe(s, callback)
    other = SubscriberClient(warehouse=warehouse)
    # While the callback runs, another puller must never get the message.
    stolen = []
    end = time.monotonic() + 16
    while time.monotonic() < end and not done.is_set():
        stolen += other.pull(subscription=s, max_messages=10, return_immediately=True).received_messages
        time.sleep(0.5)
    assert done.wait(30)
    future.cancel()
    future.result(timeout=30)
    assert stolen == []
    assert len(deliveries) == 1 and deliveries[0][1] == 1
    assert other.pull(subscription=s, max_messages=10, return_immediately=True).received_messages == []


def test_flow_control_bounds_outstanding_messages(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(40)])
    gate = Gate()
    future = sub.subscribe(subscription, gate, flow_control=FlowControl(max_messages=5))
    assert wait_for(lambda: gate.active == 5)
    time.sleep(0.5)
    # Only five are leased at all: the other 35 stay undelivered in the subscription.
    b = sub.get_backlog(subscription)
    assert (b.num_outstanding_messages, b.num_undelivered_messages) == (5, 35)
    gate.release.set()
    assert wait_for(lambda: len(gate.done) == 40)
    future.cancel()
    future.result(timeout=30)
    assert gate.peak == 5


def test_cancel_nacks_what_it_held(pub, sub, topic, subscription, warehouse):
    ids = set(pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(10)]))
    started = []
    gate = threading.Event()

    def callback(message):
        started.append(message.message_id)
        gate.wait(30)

    future = sub.subscribe(subscription, callback, flow_control=FlowControl(max_messages=10))
    assert wait_for(lambda: len(started) == 10)
    future.cancel()
    future.result(timeout=30)
    gate.set()
    # Nacked at cancel: available at once, well before the 10 s deadline.
    other = SubscriberClient(warehouse=warehouse)
    got = other.pull(subscription=subscription, max_messages=20, return_immediately=True).received_messages
    assert {r.message.message_id for r in got} == ids
    assert {r.delivery_attempt for r in got} == {2}


def test_nack_and_callback_errors_redeliver(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": b"nack me"}, {"data": b"raise"}])
    attempts: dict[bytes, list[int]] = {}

    def callback(message):
        attempts.setdefault(message.data, []).append(message.delivery_attempt)
        if message.delivery_attempt >= 3:
            message.ack()
        elif message.data == b"raise":
            raise RuntimeError("boom")
        else:
            message.nack()

    future = sub.subscribe(subscription, callback)
    assert wait_for(lambda: all(len(v) >= 3 for v in attempts.values()) and len(attempts) == 2)
    future.cancel()
    with pytest.raises(RuntimeError, match="boom"):  # the first callback error, as google-cloud-pubsub
        future.result(timeout=30)
    assert attempts == {b"nack me": [1, 2, 3], b"raise": [1, 2, 3]}


def test_callback_error_backs_off_logs_one_line_and_resolves_the_future(pub, topic, warehouse, caplog):
    clock = ManualClock(time.time())
    client = SubscriberClient(warehouse=warehouse, clock=clock)
    s = client.subscription_path("local", "failing")
    client.create_subscription(name=s, topic=topic)
    [mid] = pub.publish_batch(topic, [{"data": b"secret payload"}])
    calls: list[int] = []

    def callback(message):
        calls.append(message.delivery_attempt)
        raise ValueError("cannot parse\nthe record")

    caplog.set_level(logging.DEBUG, logger="deltabus.subscriber.streaming_pull")
    future = client.subscribe(s, callback)
    # google-cloud-pubsub: the first callback error resolves the future; the stream runs on.
    with pytest.raises(ValueError, match="cannot parse"):
        future.result(timeout=30)
    assert not future.cancelled()
    # While the clock stands still the message is not handed out again (a plain nack would
    # make it due at once, and the running stream would deliver it over and over).
    time.sleep(1.0)
    assert calls == [1]
    future.cancel()
    with pytest.raises(ValueError):
        future.result(timeout=30)
    assert future.cancelled()

    other = SubscriberClient(warehouse=warehouse, clock=clock)
    assert other.pull(subscription=s, max_messages=5, return_immediately=True).received_messages == []
    clock.advance(1.01)  # attempt 1 waits 1 s
    [again] = other.pull(subscription=s, max_messages=5, return_immediately=True).received_messages
    assert (again.message.message_id, again.delivery_attempt) == (mid, 2)

    errors = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("deltabus.subscriber")]
    assert len(errors) == 1
    line = errors[0].getMessage()
    assert s in line and mid in line and "ValueError: cannot parse the record" in line and "redelivering in 1s" in line
    assert "\n" not in line and "secret payload" not in line and errors[0].exc_info is None
    traces = [r for r in caplog.records if r.levelno == logging.DEBUG and r.exc_info]
    assert len(traces) == 1 and traces[0].exc_info[0] is ValueError
    assert "secret payload" not in caplog.text
    other.close()
    client.close()


def test_a_callback_that_acks_then_raises_is_not_redelivered_and_says_so(pub, topic, warehouse, caplog):
    client = SubscriberClient(warehouse=warehouse)
    s = client.subscription_path("local", "acks-then-raises")
    client.create_subscription(name=s, topic=topic)
    [mid] = pub.publish_batch(topic, [{"data": b"x"}])

    def callback(message):
        message.ack()
        raise ValueError("after the ack")

    caplog.set_level(logging.INFO, logger="deltabus.subscriber.streaming_pull")
    future = client.subscribe(s, callback)
    with pytest.raises(ValueError, match="after the ack"):
        future.result(timeout=30)
    future.cancel()
    assert wait_for(lambda: client.get_backlog(s).num_unacked_messages == 0)  # the ack stands
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and mid in r.getMessage()]
    assert "acked or nacked the message already" in line and "redelivering" not in line
    client.close()


def test_clean_cancel_resolves_the_future_with_true(sub, subscription):
    future = sub.subscribe(subscription, lambda m: m.ack())
    assert not future.done()
    assert future.cancel() is True
    assert future.result(timeout=30) is True and future.cancelled()


def test_deleted_subscription_ends_the_stream_with_not_found(sub, topic, subscription):
    future = sub.subscribe(subscription, lambda m: m.ack())
    sub.delete_subscription(subscription=subscription)
    with pytest.raises(NotFound):
        future.result(timeout=30)


def test_subscribe_rejects_bad_arguments(sub, subscription):
    from deltabus import InvalidArgument

    with pytest.raises(InvalidArgument):
        sub.subscribe(subscription, "not callable")
    with pytest.raises(InvalidArgument):
        sub.subscribe(subscription, print, flow_control=FlowControl(max_messages=0))
    with pytest.raises(NotFound):
        sub.subscribe("projects/local/subscriptions/missing", print)


def test_flow_control_by_bytes(pub, sub, topic, subscription):
    pub.publish_batch(topic, [{"data": b"x" * 1024} for _ in range(6)])
    gate = Gate()
    future = sub.subscribe(subscription, gate, flow_control=FlowControl(max_bytes=2500))
    assert wait_for(lambda: gate.active == 2)
    time.sleep(0.5)
    assert gate.active == 2  # a third 1 KiB message would exceed 2,500 bytes
    gate.release.set()
    assert wait_for(lambda: len(gate.done) == 6)
    future.cancel()
    future.result(timeout=30)
    assert gate.peak == 2


def leases_are_dropped_after_max_lease_duration(pub, sub, topic):
    s = sub.subscription_path("local", "long-holder")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=10)
    pub.publish_batch(topic, [{"data": b"held too long"}])
    gate = threading.Event()
    deliveries = []

    def callback(message):
        deliveries.append((message.delivery_attempt, time.monotonic()))
        gate.wait(60)

    future = sub.subscribe(s, callback, flow_control=FlowControl(max_lease_duration=1))
    # Not extended after 1 s, so the 10 s deadline runs out and the message comes again.
    assert wait_for(lambda: len(deliveries) >= 2, timeout=40)
    gate.set()
    future.cancel()
    future.result(timeout=30)
    (a1, t1), (a2, t2) = deliveries[:2]
    assert (a1, a2) == (1, 2)
    assert 8 < t2 - t1 < 25


# Both lease tests wait out a real 10 s ack deadline (the shortest Pub/Sub allows) and use
# almost no CPU meanwhile: they run in the background from this module's first test on, beside
# each other and the module's other tests (tests/background.py), each in its own warehouse.
def _with_subscriber(body, subscription):
    def scenario(tmp):
        # Their log lines stay out of the other tests' caplog (which counts warnings): the
        # dropped-lease warning would otherwise land in whichever test runs at that moment.
        quiet = _DropLinesAbout(f"subscriptions/{subscription}")
        loggers = [logging.getLogger(f"deltabus.subscriber.{m}") for m in ("streaming_pull", "client")]  # a filter sees its own logger's records only
        for log in loggers:
            log.addFilter(quiet)
        try:
            with Warehouse(tmp) as w:
                sub = SubscriberClient(warehouse=w.path)
                try:
                    body(w.pub, sub, w.topic, w.path)
                finally:
                    sub.close()
        finally:
            for log in loggers:
                log.removeFilter(quiet)

    return scenario


class _DropLinesAbout(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@pytest.fixture(scope="module", autouse=True)
def lease_waits(request, tmp_path_factory):
    yield from start_selected(request, tmp_path_factory, {
        "test_lease_is_extended_while_processing_outlasts_deadline":
            _with_subscriber(lease_is_extended_while_processing_outlasts_deadline, "slow"),
        "test_leases_are_dropped_after_max_lease_duration":
            _with_subscriber(lambda pub, sub, topic, _warehouse: leases_are_dropped_after_max_lease_duration(pub, sub, topic), "long-holder"),
    })


def test_lease_is_extended_while_processing_outlasts_deadline(lease_waits):
    lease_waits.result("test_lease_is_extended_while_processing_outlasts_deadline")


def test_leases_are_dropped_after_max_lease_duration(lease_waits):
    lease_waits.result("test_leases_are_dropped_after_max_lease_duration")
