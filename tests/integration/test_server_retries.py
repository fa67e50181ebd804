"""The REAL google-cloud-pubsub clients' retries against `deltabus serve`: they make progress
and duplicate nothing when a call fails before anything is written.

Faults are injected through ``ServerState.fault`` (tests only): the server fails a chosen
number of calls of one method with a chosen status code, either before the method runs or
after it committed (its response lost). The clients retry Publish on ABORTED and
UNAVAILABLE (among others) and Acknowledge / ModifyAckDeadline on UNAVAILABLE only.

A Publish that committed and whose response was lost is stored again when the client
retries it, with a new message id: at-least-once, as in Pub/Sub. The last test pins that.
"""

from __future__ import annotations

import collections
import threading

import grpc
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

from deltabus.server.app import ServerThread
from tests.conftest import delivery_state, table_versions
from tests.integration.test_server_publish_pull import pull_all
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

T = f"projects/{PROJECT}/topics/retried"
S = f"projects/{PROJECT}/subscriptions/retried-sub"


class Faults:
    """Fail the first `count` calls of `method` at `stage` with `code`; count every call."""

    def __init__(self, method: str, count: int, code: grpc.StatusCode, stage: str = "before") -> None:
        self.method, self.left, self.code, self.stage = method, count, code, stage
        self.calls: collections.Counter[str] = collections.Counter()
        self.failed = 0
        self.lock = threading.Lock()

    def __call__(self, method: str, stage: str) -> grpc.StatusCode | None:
        with self.lock:
            if stage == "before":
                self.calls[method] += 1
            if method == self.method and stage == self.stage and self.left > 0:
                self.left -= 1
                self.failed += 1
                return self.code
        return None


def stored(warehouse: str) -> list[bytes]:
    """The data of every row of the messages table."""
    return DeltaTable(f"{warehouse}/messages").to_pyarrow_table(columns=["data"])["data"].to_pylist()


def deliveries_rows(warehouse: str) -> int:
    return delivery_state(DeltaTable(f"{warehouse}/deliveries").to_pyarrow_table(columns=["sub_uid"])).num_rows


@pytest.fixture
def topic_sub(gpub, gsub) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(name=S, topic=T, ack_deadline_seconds=60)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED])
def test_publish_retries_make_progress_and_store_each_message_once(serve_thread: ServerThread, topic_sub, gsub, warehouse: str, code) -> None:
    commits_before = table_versions(warehouse)["messages"]
    faults = Faults("Publish", 3, code)
    serve_thread.state.fault = faults
    client = pubsub_v1.PublisherClient(batch_settings=pubsub_v1.types.BatchSettings(max_messages=10, max_latency=0.05))
    try:
        futures = [client.publish(T, f"m{i}".encode(), index=str(i)) for i in range(40)]
        ids = [f.result(timeout=60) for f in futures]
    finally:
        client.stop()
    assert faults.failed == 3  # the faults were met, and retried past
    assert faults.calls["Publish"] >= 4 + 3  # batches of at most 10, plus the three failed tries
    # Only the Publish calls that succeeded committed (several may share one commit: the
    # server's Publish group commit); a failed one wrote nothing (each message once, below).
    assert 1 <= table_versions(warehouse)["messages"] - commits_before <= faults.calls["Publish"] - 3
    assert len(set(ids)) == 40
    data = stored(warehouse)
    assert collections.Counter(data) == collections.Counter(f"m{i}".encode() for i in range(40))  # each exactly once
    got = pull_all(gsub, S, 40)
    assert sorted(r.message.message_id for r in got) == sorted(ids)


def test_acknowledge_and_modify_ack_deadline_retries_take_effect(serve_thread: ServerThread, topic_sub, gpub, gsub, warehouse: str) -> None:
    for i in range(6):
        gpub.publish(T, f"a{i}".encode()).result(timeout=30)
    got = pull_all(gsub, S, 6)
    assert len(got) == 6
    # A nack (modack 0) of two messages, failing twice with UNAVAILABLE first: they come again.
    faults = Faults("ModifyAckDeadline", 2, grpc.StatusCode.UNAVAILABLE)
    serve_thread.state.fault = faults
    gsub.modify_ack_deadline(subscription=S, ack_ids=[r.ack_id for r in got[:2]], ack_deadline_seconds=0)
    assert faults.failed == 2 and faults.calls["ModifyAckDeadline"] == 3
    again = pull_all(gsub, S, 2)
    assert sorted(r.message.message_id for r in again) == sorted(r.message.message_id for r in got[:2])
    # Acks of all six (the other four from the first delivery), failing twice first.
    faults = Faults("Acknowledge", 2, grpc.StatusCode.UNAVAILABLE)
    serve_thread.state.fault = faults
    gsub.acknowledge(subscription=S, ack_ids=[r.ack_id for r in got[2:]] + [r.ack_id for r in again])
    assert faults.failed == 2 and faults.calls["Acknowledge"] == 3
    assert deliveries_rows(warehouse) == 0  # every message acked: nothing left to deliver
    assert stored(warehouse).count(b"a0") == 1


def test_acknowledge_is_not_retried_on_aborted(serve_thread: ServerThread, topic_sub, gpub, gsub) -> None:
    # The client retries acks only on UNAVAILABLE: any other code reaches the caller, so the
    # server must answer UNAVAILABLE, not ABORTED, for a failure a retry can cure.
    gpub.publish(T, b"x").result(timeout=30)
    (r,) = pull_all(gsub, S, 1)
    serve_thread.state.fault = Faults("Acknowledge", 1, grpc.StatusCode.ABORTED)
    with pytest.raises(gexc.Aborted):
        gsub.acknowledge(subscription=S, ack_ids=[r.ack_id])


def test_a_publish_whose_response_is_lost_after_its_commit_is_stored_twice(serve_thread: ServerThread, topic_sub, warehouse: str) -> None:
    # At-least-once, as Pub/Sub: the server cannot tell a retry from a new request.
    faults = Faults("Publish", 1, grpc.StatusCode.UNAVAILABLE, stage="after")
    serve_thread.state.fault = faults
    client = pubsub_v1.PublisherClient()
    try:
        message_id = client.publish(T, b"twice").result(timeout=60)
    finally:
        client.stop()
    assert faults.failed == 1 and faults.calls["Publish"] == 2
    assert stored(warehouse).count(b"twice") == 2
    ids = DeltaTable(f"{warehouse}/messages").to_pyarrow_table(columns=["message_id", "data"])
    twice = ids.filter(pc.equal(ids["data"], b"twice"))["message_id"].to_pylist()
    assert message_id in twice and len(set(twice)) == 2
