"""Exactly-once delivery (issue 15) on real tables: a successful ack is final. Competing
pullers with leases running out under them (an injected clock), acks racing those
expiries, streams with ack_with_response, unary acks reporting the failed ids, push
subscriptions refused, and a process SIGKILLed while acking."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

import deltabus
from deltabus import SubscriberClient
from deltabus.errors import AcknowledgeError, AcknowledgeStatus, InvalidArgument
from tests.conftest import ManualClock, table_versions
from tests.integration.test_dead_letter import dlq  # noqa: F401  (a fixture)

P = "local"


def make(sub: SubscriberClient, topic: str, name: str) -> str:
    path = sub.subscription_path(P, name)
    made = sub.create_subscription(request={"name": path, "topic": topic, "enable_exactly_once_delivery": True})
    assert made.enable_exactly_once_delivery
    return path


def test_competing_pullers_with_expiring_leases_never_get_a_message_after_its_successful_ack(pub, warehouse, topic) -> None:
    clock = ManualClock(time.time())
    setup = SubscriberClient(warehouse=warehouse, clock=clock)
    name = make(setup, topic, "eod-race")
    n = 300
    pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(n)])
    lock = threading.Lock()
    delivered: dict[str, list[int]] = defaultdict(list)  # message id -> attempts delivered
    acked: dict[str, int] = {}  # message id -> the attempt whose ack succeeded
    failed_acks = 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def puller(seed: int) -> None:
        nonlocal failed_acks
        rnd = random.Random(seed)
        client = SubscriberClient(warehouse=warehouse, clock=clock)
        try:
            while not stop.is_set():
                got = client.pull(subscription=name, max_messages=rnd.randint(1, 20), return_immediately=True).received_messages
                if not got:
                    time.sleep(0.01)
                    continue
                with lock:
                    for m in got:
                        mid = m.message.message_id
                        assert mid not in acked, f"{mid} delivered (attempt {m.delivery_attempt}) after its ack succeeded"
                        delivered[mid].append(m.delivery_attempt)
                time.sleep(rnd.random() * 0.05)  # meanwhile the clock may run the leases out
                try:
                    client.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
                    ok = got
                except AcknowledgeError as exc:
                    ok = [m for m in got if m.ack_id not in exc.failed]
                    with lock:
                        failed_acks += len(exc.failed)
                    assert all(s is AcknowledgeStatus.INVALID_ACK_ID for s in exc.failed.values())
                with lock:
                    for m in ok:
                        mid = m.message.message_id
                        assert mid not in acked, f"{mid}: two acks succeeded"
                        acked[mid] = m.delivery_attempt
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=puller, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    deadline = time.time() + 120
    while len(acked) < n and time.time() < deadline and not errors:
        time.sleep(0.03)
        clock.advance(4.0)  # a 10 s lease runs out within three of these steps
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert len(acked) == n  # every message acked exactly once, none lost
    assert failed_acks > 0 and any(len(a) > 1 for a in delivered.values())  # expiries did race the acks
    for mid, attempt in acked.items():
        assert max(delivered[mid]) == attempt  # no delivery after (or beside) the acked one
    assert setup.pull(subscription=name, max_messages=10, return_immediately=True).received_messages == []
    setup.close()


def test_unary_calls_report_the_ids_that_did_not_apply_and_apply_the_others(pub, sub, topic, warehouse) -> None:
    clock = ManualClock(time.time())
    client = SubscriberClient(warehouse=warehouse, clock=clock)
    name = make(client, topic, "eod-unary")
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])
    first = client.pull(subscription=name, max_messages=2, return_immediately=True).received_messages
    clock.advance(30)  # both leases ran out
    again = client.pull(subscription=name, max_messages=1, return_immediately=True).received_messages  # one redelivered
    stale = next(m for m in first if m.message.message_id == again[0].message.message_id)
    other = next(m for m in first if m is not stale)
    with pytest.raises(AcknowledgeError) as e:
        client.modify_ack_deadline(subscription=name, ack_ids=[stale.ack_id, other.ack_id], ack_deadline_seconds=60)
    assert e.value.failed == {stale.ack_id: AcknowledgeStatus.INVALID_ACK_ID}  # `other` was not redelivered: extended
    with pytest.raises(AcknowledgeError) as e:
        client.acknowledge(subscription=name, ack_ids=[stale.ack_id, other.ack_id, again[0].ack_id])
    assert e.value.failed == {stale.ack_id: AcknowledgeStatus.INVALID_ACK_ID}
    clock.advance(600)
    assert client.pull(subscription=name, max_messages=10, return_immediately=True).received_messages == []
    with pytest.raises(AcknowledgeError):  # acked already: a second ack does not apply
        client.acknowledge(subscription=name, ack_ids=[other.ack_id])
    client.close()


def test_a_stream_with_ack_with_response(pub, sub, topic) -> None:
    name = make(sub, topic, "eod-stream")
    pub.publish_batch(topic, [{"data": f"s{i}".encode()} for i in range(50)])
    results: dict[str, object] = {}
    done = threading.Event()

    def callback(message) -> None:  # type: ignore[no-untyped-def]
        results[message.message_id] = message.ack_with_response().result(timeout=30)
        if len(results) == 50:
            done.set()

    future = sub.subscribe(name, callback)
    assert done.wait(60)
    future.cancel()
    assert set(results.values()) == {AcknowledgeStatus.SUCCESS}
    assert sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages == []
    # Without exactly-once the futures resolve too (best effort, as google-cloud-pubsub).
    plain = sub.subscription_path(P, "plain-stream")
    sub.create_subscription(name=plain, topic=topic)
    pub.publish_batch(topic, [{"data": b"p"}])
    got: list[object] = []
    ready = threading.Event()
    future = sub.subscribe(plain, lambda m: (got.append(m.nack_with_response().result(timeout=30)), ready.set()))
    assert ready.wait(30)
    future.cancel()
    assert got[0] is AcknowledgeStatus.SUCCESS


def test_push_subscriptions_cannot_enable_it_and_nothing_is_written(sub, topic, warehouse) -> None:
    name = sub.subscription_path(P, "eod-push")
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument, match="enable_exactly_once_delivery: a push subscription cannot"):
        sub.create_subscription(request={"name": name, "topic": topic, "enable_exactly_once_delivery": True,
                                         "push_config": {"push_endpoint": "https://example.invalid/push"}})
    assert table_versions(warehouse) == before
    pull = make(sub, topic, "eod-pull")
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument, match="push_config"):
        sub.modify_push_config(subscription=pull, push_config={"push_endpoint": "https://example.invalid/push"})
    with pytest.raises(InvalidArgument, match="subscription.enable_exactly_once_delivery"):
        sub.update_subscription(subscription={"name": pull, "push_config": {"push_endpoint": "https://example.invalid/push"}},
                                update_mask=["push_config"])
    assert table_versions(warehouse) == before
    off = sub.update_subscription(subscription={"name": pull, "enable_exactly_once_delivery": False},
                                  update_mask=["enable_exactly_once_delivery"])
    assert not off.enable_exactly_once_delivery


WORKER = """
import json, sys
from deltabus import SubscriberClient
from deltabus.errors import AcknowledgeError
warehouse, name = sys.argv[1], sys.argv[2]
with SubscriberClient(warehouse=warehouse) as client:
    while True:
        got = client.pull(subscription=name, max_messages=7, return_immediately=True).received_messages
        if not got:
            break
        try:
            client.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
            ok = got
        except AcknowledgeError as exc:
            ok = [m for m in got if m.ack_id not in exc.failed]
        print(json.dumps([m.message.message_id for m in ok]), flush=True)
"""


def test_a_process_killed_while_acking_loses_nothing_and_redelivers_nothing_acked(pub, sub, topic, warehouse) -> None:
    name = make(sub, topic, "eod-crash")
    ids = pub.publish_batch(topic, [{"data": f"k{i}".encode()} for i in range(400)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    acked: set[str] = set()
    for delay in (0.8, 2.0):
        proc = subprocess.Popen([sys.executable, "-c", WORKER, warehouse, name], env=env, stdout=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        for line in out.splitlines():
            acked.update(json.loads(line))
    clock = ManualClock(time.time() + 600)  # every lease the killed processes held has run out
    with SubscriberClient(warehouse=warehouse, clock=clock) as client:
        rest: list[str] = []
        while got := client.pull(subscription=name, max_messages=100, return_immediately=True).received_messages:
            rest += [m.message.message_id for m in got]
            client.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
    assert not acked & set(rest)  # a successful ack is final, across the kills
    assert len(rest) == len(set(rest))
    # Nothing is lost: each message was acked or is delivered now, but for at most one batch
    # per kill whose ack committed before the process could report it.
    assert set(rest) <= set(ids) and len(set(ids) - acked - set(rest)) <= 2 * 7
    assert acked  # the kills came after some acks


def test_an_ack_of_a_row_a_dead_letter_move_owns_fails_at_once(pub, csub, topic, dlq, monkeypatch) -> None:
    """A move marked the row and stopped (a crash before it finished): the outcome clauses
    refuse a marked row, so an exactly-once ack of it must say INVALID_ACK_ID, not rerun its
    decision until the conflict limit (found by review: 532 attempts in 120 s)."""
    from deltabus.delivery import dead_letter
    from deltabus.types import DeadLetterPolicy
    from tests.integration.test_dead_letter import nack, pull

    dl_topic, _ = dlq
    name = csub.subscription_path(P, "eod-dead-letter")
    csub.create_subscription(request={"name": name, "topic": topic, "enable_exactly_once_delivery": True,
                                      "dead_letter_policy": DeadLetterPolicy(dl_topic, 5)})
    pub.publish_batch(topic, [{"data": b"held"}])
    for i in range(5):
        (last,) = pull(csub, name)
        if i < 4:
            nack(csub, name, [last])
    csub._clock.advance(3600)  # the fifth lease runs out: the next pull gives it up
    with monkeypatch.context() as m:
        m.setattr(dead_letter.DeadLetterMover, "finish", lambda self, engine, key: None)  # the move stops after its mark
        assert pull(csub, name) == []
    csub._engine._max_conflict_seconds = 5  # were it to loop, fail in seconds
    with pytest.raises(AcknowledgeError) as e:
        csub.acknowledge(subscription=name, ack_ids=[last.ack_id])
    assert e.value.failed == {last.ack_id: AcknowledgeStatus.INVALID_ACK_ID}
