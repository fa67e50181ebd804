"""Ordering keys on real Delta tables (issue 13): a subscription with message ordering hands
each key's messages out in publish order through pull and the push job, a nack brings the
nacked message back before anything after it (and what followed it comes again too), and
messages without a key are not held back."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections import defaultdict

import pytest

from deltabus import PublisherClient, SubscriberClient, config
from deltabus.policy.pacing import CommitPacing
from deltabus.push.job import DeliveryJob
from deltabus.types import PublisherOptions
from tests.endpoints import Behaviour, Endpoint

KEYS = ("red", "green", "blue")
PER_KEY = 500
# The push job has one message per key out at a time, and a push's outcome comes back to the
# job's next commit (a round of ~0.4 s here): 500 per key would take minutes, so push uses 12.
PUSH_PER_KEY = 12


def publish_interleaved(warehouse: str, topic: str, per_key: int = PER_KEY, batches: int = 3) -> dict[str, list[bytes]]:
    """`per_key` messages of each key, keys interleaved, in `batches` commits: so order
    within a commit (ids) and across commits (versions) both matter. Returns each key's
    payloads in publish order."""
    pub = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    order: dict[str, list[bytes]] = defaultdict(list)
    rows = []
    for i in range(per_key):
        for k in KEYS:
            data = f"{k}-{i:04d}".encode()
            order[k].append(data)
            rows.append({"data": data, "ordering_key": k})
    size = -(-len(rows) // batches)
    try:
        for start in range(0, len(rows), size):
            pub.publish_batch(topic, rows[start:start + size])
    finally:
        pub.stop()
    return order


def check_in_order(delivered: list[tuple[str, bytes]], acked: dict[str, list[bytes]], order: dict[str, list[bytes]]) -> None:
    """Every key acked exactly its messages in publish order, and every delivery of a key
    came only once all earlier messages of the key were acked, or right after the
    previous delivery of the key (one pull leasing several in a row)."""
    for k in KEYS:
        assert acked[k] == order[k], k
    index = {d: i for k in KEYS for i, d in enumerate(order[k])}
    done: dict[str, int] = defaultdict(int)  # messages of the key acked so far, counted in the replay
    last: dict[str, int] = {}
    acked_set: dict[str, set[int]] = defaultdict(set)
    for kind, data in delivered:
        k = data.decode().split("-")[0]
        i = index[data]
        if kind == "ack":
            acked_set[k].add(i)
            while done[k] in acked_set[k]:
                done[k] += 1
            continue
        assert i == done[k] or i == last.get(k, -2) + 1, (k, i, done[k], last.get(k))
        last[k] = i


def test_pull_delivers_each_key_in_order_with_random_nacks(warehouse, sub, topic):
    name = sub.subscription_path("local", "ordered-pull")
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 60})
    order = publish_interleaved(warehouse, topic)
    rnd = random.Random(13)
    acked: dict[str, list[bytes]] = defaultdict(list)
    events: list[tuple[str, bytes]] = []
    nacks = 0
    pending: list = []  # each pull is answered only after the next one: two pulls are out at once

    def answer(got) -> int:
        ack_ids, nack_ids, stopped = [], [], set()
        for r in got:
            k = r.message.ordering_key
            if k in stopped:
                continue  # after a nack the client leaves the rest of that key: its leases ended too
            if rnd.random() < 0.03:
                nack_ids.append(r.ack_id)
                stopped.add(k)
                continue
            ack_ids.append(r.ack_id)
            acked[k].append(r.message.data)
            events.append(("ack", r.message.data))
        if ack_ids:
            sub.acknowledge(subscription=name, ack_ids=ack_ids)
        if nack_ids:
            sub.modify_ack_deadline(subscription=name, ack_ids=nack_ids, ack_deadline_seconds=0)
        return len(nack_ids)

    for _ in range(600):
        got = sub.pull(subscription=name, max_messages=200, return_immediately=True).received_messages
        events.extend(("deliver", r.message.data) for r in got)
        if got:
            pending.append(got)
        if pending and (len(pending) > 1 or not got):
            nacks += answer(pending.pop(0))
        if not got and not pending and sum(map(len, acked.values())) == len(KEYS) * PER_KEY:
            break
    assert nacks >= 10
    check_in_order(events, acked, order)


def test_a_nack_brings_back_what_followed_it_and_keyless_messages_flow(warehouse, sub, topic):
    name = sub.subscription_path("local", "ordered-small")
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 60})
    pub = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    try:
        pub.publish_batch(topic, [{"data": b"a1", "ordering_key": "a"}, {"data": b"a2", "ordering_key": "a"},
                                  {"data": b"a3", "ordering_key": "a"}, {"data": b"n1"}])
        first = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert [r.message.data for r in first] == [b"a1", b"a2", b"a3", b"n1"]
        # While a's messages are out, a new one of key a waits; a keyless one does not.
        pub.publish_batch(topic, [{"data": b"a4", "ordering_key": "a"}, {"data": b"n2"}])
        assert [r.message.data for r in sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages] == [b"n2"]
        # a nack of a2 ends a3's lease too: a2, a3 (then a4) come back in order, a1 stays out
        sub.modify_ack_deadline(subscription=name, ack_ids=[first[1].ack_id], ack_deadline_seconds=0)
        # ... but not while a1 is still out
        assert sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages == []
        sub.acknowledge(subscription=name, ack_ids=[first[0].ack_id])
        again = sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert [r.message.data for r in again] == [b"a2", b"a3", b"a4"]
        # a3's old ack id names a delivery that is over
        sub.acknowledge(subscription=name, ack_ids=[first[2].ack_id])
        assert [r.message.data for r in sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages] == []
    finally:
        pub.stop()


def push_per_key(received) -> dict[str, list[tuple[bytes, int]]]:
    """Per ordering key, (data, status) of every push the endpoint answered, in arrival order."""
    out: dict[str, list[tuple[bytes, int]]] = defaultdict(list)
    for r, status in received:
        body = json.loads(r.body)["message"]
        out[body.get("orderingKey", "")].append((base64.b64decode(body["data"]), status))
    return out


@pytest.mark.spark
def test_push_sends_one_message_per_key_at_a_time_in_order_with_random_failures(spark, warehouse, psub, topic):
    """A real endpoint answering 500 at random (seeded): per key, each message is pushed
    until it succeeds, and only then the next one, so the messages succeed in publish
    order and never two of a key are out at once (a retry always repeats the failed one)."""
    per_key = PUSH_PER_KEY
    rnd = random.Random(13)
    answered: list = []
    lock = threading.Lock()

    # Which messages fail, and how often, drawn up front (seeded): answers then do not depend
    # on the order in which the workers' threads happen to arrive.
    fails = {f"{k}-{i:04d}".encode(): (1 if rnd.random() < 0.2 else 0) + (1 if rnd.random() < 0.05 else 0)
             for k in KEYS for i in range(per_key)}
    seen: dict[bytes, int] = defaultdict(int)

    def respond(r, n) -> tuple[int, float]:
        data = base64.b64decode(json.loads(r.body)["message"]["data"])
        with lock:
            seen[data] += 1
            status = 500 if seen[data] <= fails[data] else 204
            answered.append((r, status))
        return status, 0.0

    with Endpoint(Behaviour(respond)) as ep:
        name = psub.subscription_path("local", "ordered-push")
        psub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True,
                                          "push_config": {"push_endpoint": ep.url}})
        order = publish_interleaved(warehouse, topic, per_key=per_key)
        settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.05, backlog_interval=5.0,
                                   engine="delta-rs")
        # Commit every batch: the pacing that batches commits at load only slows one-per-key rounds.
        job = DeliveryJob(spark, settings, pacing=CommitPacing(max_interval=0.0))
        try:
            deadline = time.monotonic() + 120
            batch = 0
            while time.monotonic() < deadline:
                batch += 1
                job.process(None, batch)
                with lock:
                    done = sum(1 for _, s in answered if s == 204)
                if done >= len(KEYS) * per_key:
                    break
        finally:
            job.close()
    pushes = push_per_key(answered)
    failures = 0
    for k in KEYS:
        expected = iter(order[k][:per_key])
        want = next(expected)
        for data, status in pushes[k]:
            assert data == want, (k, data, want)  # the next one only after this one succeeded
            if status == 204:
                want = next(expected, None)
            else:
                failures += 1
        assert want is None, k
    assert failures == sum(fails.values()) >= 3


def test_a_failed_publish_pauses_its_key_until_resume_publish(warehouse, pub, topic):
    from deltabus import NotFound, OrderingNotEnabled
    from deltabus.errors import OrderingKeyPaused
    from tests.conftest import table_versions

    ordered = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    try:
        ordered.publish(topic, b"a1", ordering_key="a").result(30)
        pub.delete_topic(topic=topic)
        with pytest.raises(NotFound):
            ordered.publish(topic, b"a2", ordering_key="a").result(30)  # the commit fails: key a pauses
        pub.create_topic(name=topic)
        before = table_versions(warehouse)
        with pytest.raises(OrderingKeyPaused, match="resume_publish"):
            ordered.publish(topic, b"a3", ordering_key="a").result(30)  # at once, nothing written
        assert table_versions(warehouse) == before
        assert ordered.publish(topic, b"b1", ordering_key="b").result(30)  # other keys and no key go on
        assert ordered.publish(topic, b"n1").result(30)
        ordered.resume_publish(topic, "a")
        assert ordered.publish(topic, b"a4", ordering_key="a").result(30)
    finally:
        ordered.stop()
    with pytest.raises(OrderingNotEnabled):
        PublisherClient(warehouse=warehouse).resume_publish(topic, "a")


def test_subscribe_runs_one_callback_per_key_at_a_time_in_order_with_random_nacks(warehouse, sub, topic):
    name = sub.subscription_path("local", "ordered-stream")
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 60})
    order = publish_interleaved(warehouse, topic)
    rnd = random.Random(13)
    # which messages the callback nacks on their first delivery, drawn up front (seeded), so
    # the outcome does not depend on thread timing
    nack_first = {d for k in KEYS for d in order[k] if rnd.random() < 0.02}
    calls: dict[str, list[tuple[bytes, str]]] = defaultdict(list)
    running: set[str] = set()
    overlaps: list[str] = []
    seen: set[bytes] = set()
    lock = threading.Lock()
    done = threading.Event()
    acked = [0]

    def callback(message) -> None:
        k, data = message.ordering_key, message.data
        with lock:
            if k in running:
                overlaps.append(k)
            running.add(k)
            first = data not in seen
            seen.add(data)
        time.sleep(0)  # let another callback of the key run now, if the stream allowed one
        with lock:
            running.discard(k)
            if first and data in nack_first:
                calls[k].append((data, "nack"))
                message.nack()
                return
            calls[k].append((data, "ack"))
            acked[0] += 1
            if acked[0] == len(KEYS) * PER_KEY:
                done.set()
        message.ack()

    future = sub.subscribe(name, callback)
    try:
        assert done.wait(60), acked[0]
    finally:
        future.cancel()
    assert overlaps == []
    assert len(nack_first) >= 10
    for k in KEYS:
        want = [x for d in order[k] for x in ([(d, "nack")] if d in nack_first else []) + [(d, "ack")]]
        assert calls[k] == want, k


@pytest.mark.spark
@pytest.mark.cluster
def test_delta_spark_holds_keys_and_cascades_a_nack(spark, warehouse, sub, topic):
    """The engine's part of ordering: the held-keys read and the available read that leaves
    their rows out (Arrow filters with casts and value sets), the cascade's CASCADE rows in
    Spark's MERGE, and the ACK clause refusing a delivery the cascade ended. In the cluster group: delta-spark's reads and MERGEs take seconds each here."""
    from deltabus.storage import open_engine
    from tests.conftest import requires_delta

    requires_delta(spark)
    name = sub.subscription_path("local", "ordered-spark")
    # 600 s leases: delta-spark's calls here take tens of seconds, and no lease may run out meanwhile
    sub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 600})
    pub = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    try:
        pub.publish_batch(topic, [{"data": b"a1", "ordering_key": "a"}, {"data": b"a2", "ordering_key": "a"},
                                  {"data": b"b1", "ordering_key": "b"}])
        engine = open_engine(warehouse, engine="delta-spark", spark=spark, create=False)
        client = SubscriberClient(engine=engine)
        try:
            first = client.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
            assert [r.message.data for r in first] == [b"a1", b"a2", b"b1"]
            pub.publish_batch(topic, [{"data": b"a3", "ordering_key": "a"}, {"data": b"n1"}])
            assert [r.message.data for r in client.pull(subscription=name, max_messages=10, return_immediately=True).received_messages] == [b"n1"]
            client.modify_ack_deadline(subscription=name, ack_ids=[first[0].ack_id], ack_deadline_seconds=0)
            client.acknowledge(subscription=name, ack_ids=[first[1].ack_id])  # a2's ended delivery: the ACK clause refuses it
            again = client.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
            assert [r.message.data for r in again] == [b"a1", b"a2", b"a3"]
        finally:
            client.close()
    finally:
        pub.stop()


def _pulled(client, name: str) -> list[bytes]:
    return [r.message.data for r in client.pull(subscription=name, max_messages=10, return_immediately=True).received_messages]


def test_an_ack_or_nack_of_a_delivery_the_nack_cascade_ended_does_not_apply(warehouse, csub, clock, topic):
    """After a nack of a1, the deliveries of a2 and a3 that were out are over: acking a2 by its
    old ack id would take it out of its key's order (a1 again, then a3), and a nack of a3's
    old id, later than a1's, would hold a3 until after a1 is due. Both are refused (the
    counting calls and the per-id results alike), and a1, a2, a3 come again, in order, as
    soon as a1's retry delay has passed."""
    from deltabus import ackid
    from deltabus.delivery.model import Result
    from deltabus.delivery.operations import acknowledge_results, modify_deadline_results
    from deltabus.registry import Registry
    from deltabus.storage import open_engine

    name = csub.subscription_path("local", "ordered-stale")
    csub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 60,
                                      "retry_policy": {"minimum_backoff": {"seconds": 30}, "maximum_backoff": {"seconds": 30}}})
    pub = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    try:
        pub.publish_batch(topic, [{"data": d, "ordering_key": "a"} for d in (b"a1", b"a2", b"a3")])
        first = csub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert [r.message.data for r in first] == [b"a1", b"a2", b"a3"]
        csub.modify_ack_deadline(subscription=name, ack_ids=[first[0].ack_id], ack_deadline_seconds=0)  # a1 due in 30 s
        clock.advance(15)
        csub.acknowledge(subscription=name, ack_ids=[first[1].ack_id])
        csub.modify_ack_deadline(subscription=name, ack_ids=[first[2].ack_id], ack_deadline_seconds=0)  # would be due in 45 s
        engine = open_engine(warehouse, create=False)
        rec = Registry(engine, clock=clock).subscription(name)
        ended = [tuple(ackid.decode(r.ack_id))[1:] for r in first[1:]]
        assert [r.result for r in acknowledge_results(engine, rec, ended)] == [Result.INVALID_ACK_ID] * 2
        assert [r.result for r in modify_deadline_results(engine, rec, ended, 0, clock=clock)] == [Result.INVALID_ACK_ID] * 2
        assert [r.result for r in modify_deadline_results(engine, rec, ended, 60, clock=clock)] == [Result.INVALID_ACK_ID] * 2
        clock.advance(10)
        assert _pulled(csub, name) == []  # a1 waits out its delay, and a2, a3 wait behind it
        clock.advance(6)
        again = csub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert [r.message.data for r in again] == [b"a1", b"a2", b"a3"]
        assert [r.delivery_attempt for r in again] == [2, 2, 2]  # the cascade counts no extra attempt
        csub.acknowledge(subscription=name, ack_ids=[r.ack_id for r in again])
        assert _pulled(csub, name) == []
    finally:
        pub.stop()


def test_a_lease_that_runs_out_brings_back_what_followed_it(warehouse, csub, clock, topic):
    """a1's lease runs out while a2's and a3's were extended: the next lease decision ends
    theirs (and leases nothing of key a in that decision), then a1, a2, a3 come in order.
    Without it a2 and a3 would be processed first and a1 redelivered after them."""
    name = csub.subscription_path("local", "ordered-expiry")
    csub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 10})
    pub = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    try:
        pub.publish_batch(topic, [{"data": b"a1", "ordering_key": "a"}, {"data": b"a2", "ordering_key": "a"},
                                  {"data": b"a3", "ordering_key": "a"}, {"data": b"b1", "ordering_key": "b"}])
        first = csub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert [r.message.data for r in first] == [b"a1", b"a2", b"a3", b"b1"]
        csub.modify_ack_deadline(subscription=name, ack_ids=[r.ack_id for r in first[1:]], ack_deadline_seconds=60)
        clock.advance(5)
        assert _pulled(csub, name) == []  # nothing ran out yet: nothing ends, nothing comes
        clock.advance(6)  # a1's lease (10 s) has run out; a2, a3 and b1 hold theirs
        assert _pulled(csub, name) == []  # this decision ends a2's and a3's leases, and key a stays held in it
        csub.acknowledge(subscription=name, ack_ids=[first[1].ack_id])  # a2's ended delivery: refused
        again = csub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert [r.message.data for r in again] == [b"a1", b"a2", b"a3"]
        assert [r.delivery_attempt for r in again] == [2, 2, 2]
        csub.acknowledge(subscription=name, ack_ids=[r.ack_id for r in again] + [first[3].ack_id])
        clock.advance(120)
        assert _pulled(csub, name) == []
    finally:
        pub.stop()


def test_a_message_marked_for_dead_lettering_ends_no_lease_of_its_key(warehouse, pub, csub, clock, topic, monkeypatch):
    """a1 reaches its attempt limit by a lease running out; the decision that gives it up
    (marks it for its dead-letter move) leases a2. A second decision that runs before the
    move is finished (a racing pull that recovered before that commit) must not take a1 for
    a run-out head and end a2's rightful lease."""
    from deltabus.delivery.dead_letter import DeadLetterMover
    from deltabus.types import DeadLetterPolicy

    dl_topic = pub.topic_path("local", "ordered-dead-letters")
    pub.create_topic(name=dl_topic)
    dl_sub = csub.subscription_path("local", "ordered-dead-letters-pull")
    csub.create_subscription(name=dl_sub, topic=dl_topic)
    name = csub.subscription_path("local", "ordered-dl")
    csub.create_subscription(request={"name": name, "topic": topic, "enable_message_ordering": True, "ack_deadline_seconds": 10,
                                      "dead_letter_policy": DeadLetterPolicy(dl_topic, 5)})
    pub.publish_batch(topic, [{"data": b"a1", "ordering_key": "a"}, {"data": b"a2", "ordering_key": "a"}])
    for attempt in range(1, 6):
        (got,) = csub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
        assert (got.message.data, got.delivery_attempt) == (b"a1", attempt)
        if attempt < 5:
            csub.modify_ack_deadline(subscription=name, ack_ids=[got.ack_id], ack_deadline_seconds=0)
    clock.advance(11)  # the 5th lease runs out
    with monkeypatch.context() as m:
        m.setattr(DeadLetterMover, "finish", lambda self, engine, key: None)  # the move is left marked
        (a2,) = csub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
        assert a2.message.data == b"a2"
        m.setattr(DeadLetterMover, "recover", lambda self, engine: [])  # a pull that recovered before that commit
        assert _pulled(csub, name) == []
        csub.acknowledge(subscription=name, ack_ids=[a2.ack_id])  # still the current delivery: it applies
    assert _pulled(csub, name) == []  # this pull finishes the move; a2 does not come back
    assert _pulled(csub, dl_sub) == [b"a1"]
    assert csub.get_backlog(name).num_unacked_messages == 0
