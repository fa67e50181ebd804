"""`deltabus serve`: publishing and unary Pull/Acknowledge/ModifyAckDeadline through the REAL
google-cloud-pubsub client, the limits' errors (nothing written), and a SIGKILLed server
process that loses nothing published and unacked."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pb

from tests.conftest import table_versions
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

T = f"projects/{PROJECT}/topics/events"
S = f"projects/{PROJECT}/subscriptions/events-sub"


def pull_all(gsub, sub: str, expect: int, deadline: float = 20.0) -> list:
    got: list = []
    give_up = time.monotonic() + deadline
    while len(got) < expect and time.monotonic() < give_up:
        got += gsub.pull(subscription=sub, max_messages=expect - len(got), return_immediately=True).received_messages
    return got


@pytest.fixture
def topic_sub(gpub, gsub) -> tuple[str, str]:
    gpub.create_topic(name=T)
    gsub.create_subscription(name=S, topic=T)
    return T, S


def test_publish_batches_with_attributes(serve_thread, topic_sub, gsub, warehouse: str) -> None:
    before = table_versions(warehouse)["messages"]
    client = pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=10, max_latency=0.2))
    try:
        futures = [client.publish(T, f"m{i}".encode(), index=str(i), kind="test") for i in range(50)]
        ids = [f.result(timeout=30) for f in futures]
    finally:
        client.stop()
    assert len(set(ids)) == 50
    commits = table_versions(warehouse)["messages"] - before
    assert 1 <= commits <= 5  # batches of up to 10: a Publish request is never split (requests may share a commit)
    got = pull_all(gsub, S, 50)
    assert sorted(int(r.message.attributes["index"]) for r in got) == list(range(50))
    for r in got:
        assert r.message.data == f"m{r.message.attributes['index']}".encode()
        assert r.message.attributes["kind"] == "test" and r.message.publish_time is not None
        assert r.message.message_id == ids[int(r.message.attributes["index"])]
        assert r.delivery_attempt == 0  # no dead-letter policy: Pub/Sub leaves it unset
    gsub.acknowledge(subscription=S, ack_ids=[r.ack_id for r in got])
    assert list(gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages) == []


def test_ordering_keys_arrive_in_order(serve_thread, gpub, gsub) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "enable_message_ordering": True})
    client = pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
    try:
        futures = [client.publish(T, f"{key}-{i}".encode(), ordering_key=key) for i in range(5) for key in ("a", "b")]
        [f.result(timeout=30) for f in futures]
    finally:
        client.stop()
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(10):  # one outstanding message per key: ack what comes, pull again
        got = gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages
        for r in got:
            key, i = r.message.data.decode().split("-")
            assert r.message.ordering_key == key
            seen[key].append(int(i))
        if got:
            gsub.acknowledge(subscription=S, ack_ids=[r.ack_id for r in got])
        if all(len(v) == 5 for v in seen.values()):
            break
    assert seen == {"a": list(range(5)), "b": list(range(5))}


@pytest.mark.filterwarnings('ignore:The "api" property:DeprecationWarning')  # the raw Publish call, on purpose
def test_the_limits_errors_write_nothing(serve_thread, topic_sub, gpub, warehouse: str) -> None:
    before = table_versions(warehouse)
    too_many = {f"k{i}": "v" for i in range(101)}
    with pytest.raises(gexc.InvalidArgument, match="attributes"):
        gpub.publish(T, b"x", **too_many).result(timeout=30)
    # the client checks a message's size itself; its API layer sends what it is given
    with pytest.raises(gexc.InvalidArgument, match=r"messages\[1\]\.data"):
        gpub.api.publish(topic=T, messages=[pb.PubsubMessage(data=b"ok"), pb.PubsubMessage(data=b"x" * 10_000_001)])
    with pytest.raises(gexc.InvalidArgument, match=r"messages\[0\]"):
        gpub.api.publish(topic=T, messages=[pb.PubsubMessage(data=b"")])
    with pytest.raises(gexc.InvalidArgument, match="goog"):
        gpub.api.publish(topic=T, messages=[pb.PubsubMessage(data=b"x", attributes={"googx": "1"})])
    with pytest.raises(gexc.InvalidArgument, match="messages"):
        gpub.api.publish(topic=T, messages=[])
    with pytest.raises(gexc.NotFound):
        gpub.api.publish(topic=f"projects/{PROJECT}/topics/missing", messages=[pb.PubsubMessage(data=b"x")])
    with pytest.raises(gexc.InvalidArgument, match="topic"):
        gpub.api.publish(topic="projects/p/topics/x", messages=[pb.PubsubMessage(data=b"x")])
    assert table_versions(warehouse) == before


def test_pull_ack_nack_and_extend(serve_thread, topic_sub, gpub, gsub) -> None:
    ids = [gpub.publish(T, f"{i}".encode()).result(timeout=30) for i in range(4)]
    got = pull_all(gsub, S, 4)
    assert sorted(r.message.message_id for r in got) == sorted(ids)
    acked, nacked = got[:2], got[2:]
    gsub.acknowledge(subscription=S, ack_ids=[r.ack_id for r in acked])
    gsub.modify_ack_deadline(subscription=S, ack_ids=[r.ack_id for r in nacked], ack_deadline_seconds=0)  # nack
    again = pull_all(gsub, S, 2)
    assert sorted(r.message.message_id for r in again) == sorted(r.message.message_id for r in nacked)
    gsub.modify_ack_deadline(subscription=S, ack_ids=[r.ack_id for r in again], ack_deadline_seconds=600)  # extend
    assert list(gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages) == []
    gsub.acknowledge(subscription=S, ack_ids=[r.ack_id for r in again])
    # an ack id of an acked message again changes nothing (it is ignored, as Pub/Sub does)
    gsub.acknowledge(subscription=S, ack_ids=[acked[0].ack_id])
    assert list(gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages) == []


def test_a_waiting_pull_returns_when_a_message_is_published(serve_thread, topic_sub, gpub, gsub) -> None:
    result: list = []
    t = threading.Thread(target=lambda: result.append(gsub.pull(subscription=S, max_messages=5, timeout=30)))
    t.start()
    time.sleep(0.5)
    mid = gpub.publish(T, b"late").result(timeout=30)
    t.join(timeout=30)
    assert [r.message.message_id for r in result[0].received_messages] == [mid]


def test_pull_errors(serve_thread, topic_sub, gsub) -> None:
    with pytest.raises(gexc.NotFound):
        gsub.pull(subscription=f"projects/{PROJECT}/subscriptions/missing", max_messages=1, return_immediately=True)
    with pytest.raises(gexc.InvalidArgument, match="max_messages"):
        gsub.pull(subscription=S, max_messages=0, return_immediately=True)
    with pytest.raises(gexc.InvalidArgument, match="ack_ids"):
        gsub.acknowledge(subscription=S, ack_ids=["not-an-ack-id"])
    with pytest.raises(gexc.InvalidArgument, match="ack_ids"):
        gsub.acknowledge(subscription=S, ack_ids=[])
    with pytest.raises(gexc.InvalidArgument, match="ack_deadline_seconds"):
        gsub.modify_ack_deadline(subscription=S, ack_ids=["s1.1.1"], ack_deadline_seconds=601)


# -- a real server process, killed -----------------------------------------------------------
def _start(warehouse: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltabus.cli", "serve", "--warehouse", warehouse, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    line = proc.stdout.readline()
    m = re.search(r" on (127\.0\.0\.1:\d+),", line)
    assert m, line
    return proc, m.group(1)


def test_a_sigkilled_server_loses_nothing_published_and_unacked(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, host = _start(warehouse)
    try:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
        pub, sub = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        pub.create_topic(name=T)
        sub.create_subscription(name=S, topic=T, ack_deadline_seconds=10)
        ids = [pub.publish(T, f"{i}".encode()).result(timeout=30) for i in range(5)]
        leased = pull_all(sub, S, 3)  # three leased, two never delivered
        assert len(leased) == 3
        pub.stop()
        sub.close()
        leased_at = time.monotonic()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc, host = _start(warehouse)
    try:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", host)
        sub = pubsub_v1.SubscriberClient()
        first = pull_all(sub, S, 2, deadline=5)
        assert sorted(r.message.message_id for r in first) == sorted(set(ids) - {r.message.message_id for r in leased})
        assert list(sub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages) == []  # still leased
        time.sleep(max(0.0, leased_at + 10.5 - time.monotonic()))  # the leases' deadline passes
        later = pull_all(sub, S, 3)
        assert sorted(r.message.message_id for r in later) == sorted(r.message.message_id for r in leased)
        sub.acknowledge(subscription=S, ack_ids=[r.ack_id for r in first + later])
        assert list(sub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages) == []
        sub.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_pull_response_stays_under_the_clients_4_mib_limit(serve_thread, topic_sub, gpub, gsub) -> None:
    """The emulator channel takes at most 4 MiB per response (FACTS.md): what does not fit is
    given back at once and comes with the next pull."""
    big = [gpub.publish(T, bytes([i]) * 1_900_000).result(timeout=30) for i in range(3)]
    first = gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages
    assert len(first) == 2
    second = pull_all(gsub, S, 1, deadline=5)
    assert sorted(r.message.message_id for r in list(first) + second) == sorted(big)
    assert all(len(r.message.data) == 1_900_000 for r in list(first) + second)


def test_a_request_with_an_unknown_field_is_refused_and_writes_nothing(serve_thread, topic_sub, warehouse: str) -> None:
    """A raw Publish whose message carries field number 100 (not in google.pubsub.v1)."""
    import grpc

    before = table_versions(warehouse)
    inner = pb.PubsubMessage.serialize(pb.PubsubMessage(data=b"a")) + b"\xa0\x06\x01"
    raw = pb.PublishRequest.serialize(pb.PublishRequest(topic=T)) + b"\x12" + bytes([len(inner)]) + inner
    with grpc.insecure_channel(f"127.0.0.1:{serve_thread.port}") as channel:
        publish = channel.unary_unary("/google.pubsub.v1.Publisher/Publish")
        with pytest.raises(grpc.RpcError) as e:
            publish(raw, timeout=10)
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "messages[0].#100" in e.value.details()
    assert table_versions(warehouse) == before


def test_delivery_attempt_is_filled_with_a_dead_letter_policy(serve_thread, gpub, gsub) -> None:
    gpub.create_topic(name=T)
    dlq = gpub.create_topic(name=f"projects/{PROJECT}/topics/events-dlq").name
    gsub.create_subscription(request={"name": S, "topic": T, "dead_letter_policy": {"dead_letter_topic": dlq}})
    gpub.publish(T, b"x").result(timeout=30)
    first = pull_all(gsub, S, 1)
    assert [r.delivery_attempt for r in first] == [1]
    gsub.modify_ack_deadline(subscription=S, ack_ids=[first[0].ack_id], ack_deadline_seconds=0)
    assert [r.delivery_attempt for r in pull_all(gsub, S, 1)] == [2]
