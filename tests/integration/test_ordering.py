"""Ordering keys on real Delta tables (issue 13): a subscription with message ordering hands
each key's messages out in publish order through pull and the push job, a nack brings the
nacked message back before anything after it (and what followed it comes again too), and
messages without a key are not held back."""

from __future__ import annotations

import random
import time
from collections import defaultdict

import pytest

from deltabus import PublisherClient, SubscriberClient
from deltabus.types import PublisherOptions

KEYS = ("red", "green", "blue")
PER_KEY = 500


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
