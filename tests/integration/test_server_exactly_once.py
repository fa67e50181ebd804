"""`deltabus serve`: exactly-once delivery (issue 15) with the REAL google-cloud-pubsub client.

The client learns that a subscription is exactly-once from StreamingPull's
``subscription_properties``; it then sends acks and deadline changes (its receipt modack too)
as unary calls and reads a result per ack id from their error's rich status: an ErrorInfo
whose metadata maps each failed id to PERMANENT_FAILURE_INVALID_ACK_ID. Time: the server runs
on an injected clock that a test moves forward, so leases run out without waiting.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any, Iterator

import pytest
from deltalake import DeltaTable
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber._protocol.streaming_pull_manager import _get_ack_errors
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.pubsub_v1 import types as pb
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from deltabus.server import streaming
from deltabus.server.app import ServerThread
from deltabus.server.settings import ServeSettings

PROJECT = "proj"
T = f"projects/{PROJECT}/topics/eod-topic"
ACK_ID = re.compile(r"^[A-Za-z0-9_\-]+\.([0-9]+)\.([0-9]+)\.(-?[0-9]+)$")  # <sub_uid>.<message>.<attempt>.<version>
INVALID = "PERMANENT_FAILURE_INVALID_ACK_ID"


def sub_name(short: str) -> str:
    return f"projects/{PROJECT}/subscriptions/{short}"


class Clock:
    """Wall-clock time plus an offset a test moves forward (the server's leases read it)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(warehouse: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    srv = ServerThread(ServeSettings(warehouse=warehouse, port=0, allow_http=True, grace_seconds=1.0), clock=clock).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{srv.port}")
    yield srv
    srv.stop()


@pytest.fixture
def gpub(server: ServerThread) -> Iterator[Any]:
    client = pubsub_v1.PublisherClient()
    yield client
    client.stop()


@pytest.fixture
def gsub(server: ServerThread) -> Iterator[Any]:
    client = pubsub_v1.SubscriberClient()
    yield client
    client.close()


def on_loop(server: ServerThread, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, server._loop).result(timeout=30)


def rows(warehouse: str, sub_uid: str) -> dict[str, tuple[int, float | None]]:
    """message_id -> (delivery_attempt, lease end in clock seconds) of the subscription's deliveries rows."""
    t = DeltaTable(f"{warehouse}/deliveries").to_pyarrow_table(
        columns=["sub_uid", "message_id", "delivery_attempt", "lease_expires"])
    return {m: (a, e.timestamp() if e is not None else None)
            for u, m, a, e in zip(t["sub_uid"].to_pylist(), t["message_id"].to_pylist(), t["delivery_attempt"].to_pylist(),
                                  t["lease_expires"].to_pylist()) if u == sub_uid}


def sub_uid(server: ServerThread, name: str) -> str:
    return server.state.registry.subscription(name).sub_uid


def wait_for(cond: Any, timeout: float = 15.0) -> None:
    give_up = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.02)


def failed_ids(exc: gexc.GoogleAPICallError) -> dict[str, str]:
    """The ErrorInfo metadata of the call's rich status, checked as google-cloud-pubsub reads it."""
    status = rpc_status.from_call(exc.response)  # ValueError if its code or message differ from the call's
    assert status is not None and len(status.details) == 1
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("EXACTLY_ONCE_ACKID_FAILURE", "pubsub.googleapis.com")
    assert _get_ack_errors(exc) == dict(info.metadata)  # what the client's subscribe() acts on
    return dict(info.metadata)


def pull_one(gsub: Any, name: str) -> Any:
    got = gsub.pull(subscription=name, max_messages=1, timeout=30).received_messages
    assert len(got) == 1
    return got[0]


# -- (a) administration ----------------------------------------------------------------------
def test_exactly_once_is_a_subscription_field_for_pull_only(server, gpub, gsub) -> None:
    gpub.create_topic(name=T)
    s = sub_name("eod-admin")
    created = gsub.create_subscription(request={"name": s, "topic": T, "enable_exactly_once_delivery": True})
    assert created.enable_exactly_once_delivery
    assert gsub.get_subscription(subscription=s).enable_exactly_once_delivery
    assert any(x.name == s and x.enable_exactly_once_delivery for x in gsub.list_subscriptions(project=f"projects/{PROJECT}"))

    push = {"push_endpoint": "http://127.0.0.1:9/push"}
    with pytest.raises(gexc.InvalidArgument, match="exactly-once"):
        gsub.create_subscription(request={"name": sub_name("eod-push"), "topic": T, "push_config": push,
                                          "enable_exactly_once_delivery": True})
    with pytest.raises(gexc.InvalidArgument, match="exactly-once"):  # an exactly-once subscription cannot become push
        gsub.modify_push_config(subscription=s, push_config=push)

    # update: turned off and on through the mask; a push subscription cannot turn it on
    off = gsub.update_subscription(request={"subscription": {"name": s}, "update_mask": {"paths": ["enable_exactly_once_delivery"]}})
    assert not off.enable_exactly_once_delivery and not gsub.get_subscription(subscription=s).enable_exactly_once_delivery
    on = gsub.update_subscription(request={"subscription": {"name": s, "enable_exactly_once_delivery": True},
                                           "update_mask": {"paths": ["enable_exactly_once_delivery"]}})
    assert on.enable_exactly_once_delivery
    gsub.create_subscription(request={"name": sub_name("plain-push"), "topic": T, "push_config": push})
    with pytest.raises(gexc.InvalidArgument, match="exactly-once"):
        gsub.update_subscription(request={"subscription": {"name": sub_name("plain-push"), "enable_exactly_once_delivery": True},
                                          "update_mask": {"paths": ["enable_exactly_once_delivery"]}})


# -- (b) subscribe(): every ack confirmed, nothing redelivered -------------------------------------
def test_subscribe_confirms_every_ack_and_redelivers_nothing(server, gpub, gsub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    s = sub_name("eod-subscribe")
    gsub.create_subscription(request={"name": s, "topic": T, "enable_exactly_once_delivery": True})
    n = 50
    for f in [gpub.publish(T, f"m{i}".encode()) for i in range(n)]:
        f.result(timeout=30)
    seen: list[tuple[str, Any, bool]] = []
    lock = threading.Lock()

    def callback(message: Any) -> None:
        try:
            status: Any = message.ack_with_response().result(timeout=30)
        except Exception as exc:  # recorded: the assertion below names it
            status = exc
        with lock:
            seen.append((message.message_id, status, message.exactly_once_enabled))

    future = gsub.subscribe(s, callback)
    try:
        wait_for(lambda: len(seen) >= n, 30)
        uid = sub_uid(server, s)
        wait_for(lambda: not rows(warehouse, uid))  # every ack committed (each was confirmed, so at once)
        time.sleep(1.2)  # a stream's idle recheck: a redelivery would show up in it
    finally:
        future.cancel()
        future.result(timeout=30)
    assert len(seen) == n and len({m for m, _, _ in seen}) == n  # no message twice
    assert {st for _, st, _ in seen} == {AcknowledgeStatus.SUCCESS}
    assert all(eod for _, _, eod in seen)  # the client knew: subscription_properties said so


# -- (c) a superseded delivery's ack fails, by ack id ----------------------------------------------
def test_unary_ack_of_a_superseded_delivery_fails_by_ack_id(server, gpub, gsub, clock: Clock, warehouse: str) -> None:
    gpub.create_topic(name=T)
    s = sub_name("eod-unary")
    gsub.create_subscription(request={"name": s, "topic": T, "ack_deadline_seconds": 10, "enable_exactly_once_delivery": True})
    gpub.publish(T, b"x").result(timeout=30)
    first = pull_one(gsub, s)  # consumer A, through Pull (ack ids in the 4-part form)
    m = ACK_ID.match(first.ack_id)
    assert m is not None and m.group(1) == first.message.message_id and m.group(2) == "1"
    clock.offset += 11  # A's 10 s lease runs out ...
    second = pull_one(gsub, s)  # ... and consumer B gets the message again
    assert second.message.message_id == first.message.message_id and ACK_ID.match(second.ack_id).group(2) == "2"  # type: ignore[union-attr]

    with pytest.raises(gexc.InvalidArgument) as e:  # A's deadline change: its id names no current delivery
        gsub.modify_ack_deadline(subscription=s, ack_ids=[first.ack_id], ack_deadline_seconds=30)
    assert failed_ids(e.value) == {first.ack_id: INVALID}
    with pytest.raises(gexc.InvalidArgument) as e:  # A's ack with B's: B's applies, A's is named
        gsub.acknowledge(subscription=s, ack_ids=[first.ack_id, second.ack_id])
    assert failed_ids(e.value) == {first.ack_id: INVALID}
    assert rows(warehouse, sub_uid(server, s)) == {}  # B's ack applied: acked for good
    clock.offset += 30
    assert list(gsub.pull(subscription=s, max_messages=1, return_immediately=True).received_messages) == []
    with pytest.raises(gexc.InvalidArgument) as e:  # acked already: B's id no longer applies either
        gsub.acknowledge(subscription=s, ack_ids=[second.ack_id])
    assert failed_ids(e.value) == {second.ack_id: INVALID}


def test_subscribe_ack_of_a_superseded_delivery_fails(server, gpub, gsub, clock: Clock, warehouse: str) -> None:
    gpub.create_topic(name=T)
    s = sub_name("eod-superseded")
    gsub.create_subscription(request={"name": s, "topic": T, "ack_deadline_seconds": 10, "enable_exactly_once_delivery": True})
    gpub.publish(T, b"x").result(timeout=30)
    got = threading.Event()
    release = threading.Event()
    outcome: dict[str, Any] = {}

    def callback(message: Any) -> None:
        if "message" in outcome:  # not expected (B holds it); acked so the test would say so
            outcome.setdefault("again", []).append(message.ack_with_response().result(timeout=30))
            return
        outcome["message"] = message
        got.set()
        release.wait(30)
        try:
            outcome["status"] = message.ack_with_response().result(timeout=30)
        except AcknowledgeError as exc:
            outcome["error"] = exc

    future = gsub.subscribe(s, callback)
    try:
        assert got.wait(30)
        message = outcome["message"]
        hub = streaming.hub_of(server.state)
        assert hub is not None

        async def other_consumer() -> Any:
            # A's lease (60 s at least: the exactly-once client's minimum) runs out, and in the
            # same turn of the loop another consumer asks: its ask is the first of the next round,
            # which leases in arrival order. Not while a round runs: it would read the moved clock
            # and could lease the message again to A's stream, if that stream asked in it.
            while s in hub.commits._running:
                await asyncio.sleep(0.001)
            clock.offset += 700
            return await hub.commits.lease(s, 1, 60.0)

        granted = on_loop(server, other_consumer())
        assert [m.message.message_id for m in granted.messages] == [message.message_id]
        b_id = granted.messages[0].ack_id
        assert ACK_ID.match(b_id).group(2) == "2" and b_id != message.ack_id  # type: ignore[union-attr]
        release.set()
        wait_for(lambda: "status" in outcome or "error" in outcome, 30)
        err = outcome.get("error")
        assert err is not None and err.error_code is AcknowledgeStatus.INVALID_ACK_ID, outcome
        assert rows(warehouse, sub_uid(server, s))[message.message_id][0] == 2  # B's delivery stands
        gsub.acknowledge(subscription=s, ack_ids=[b_id])  # B's ack applies (no error)
        assert rows(warehouse, sub_uid(server, s)) == {}
    finally:
        release.set()
        future.cancel()
        future.result(timeout=30)
    assert "again" not in outcome


# -- stream-borne outcomes of an exactly-once subscription still apply ---------------------------------
def test_acks_and_modacks_on_the_stream_apply(server, gpub, gsub, clock: Clock, warehouse: str) -> None:
    """A client that sends its outcomes on the stream (not google-cloud-pubsub's exactly-once
    mode, but allowed): they report nothing, and apply only to the current delivery."""
    import queue

    gpub.create_topic(name=T)
    s = sub_name("eod-stream")
    gsub.create_subscription(request={"name": s, "topic": T, "ack_deadline_seconds": 10, "enable_exactly_once_delivery": True})
    gpub.publish(T, b"x").result(timeout=30)
    uid = sub_uid(server, s)
    outbox: queue.Queue[Any] = queue.Queue()
    outbox.put(pb.StreamingPullRequest(subscription=s, stream_ack_deadline_seconds=10, max_outstanding_messages=10))

    def requests() -> Iterator[Any]:
        while (r := outbox.get()) is not None:
            yield r

    responses = gsub.streaming_pull(requests=requests(), timeout=60)
    try:
        first = next(responses)
        assert first.subscription_properties.exactly_once_delivery_enabled
        a1 = first.received_messages[0].ack_id
        mid = first.received_messages[0].message.message_id
        assert ACK_ID.match(a1).group(2) == "1"  # type: ignore[union-attr]
        outbox.put(pb.StreamingPullRequest(modify_deadline_ack_ids=[a1], modify_deadline_seconds=[60]))
        wait_for(lambda: (rows(warehouse, uid)[mid][1] or 0) > clock() + 50)  # extended past the stream's 10 s
        clock.offset += 100  # the lease runs out: the stream leases it again
        again = next(responses)
        a2 = again.received_messages[0].ack_id
        assert again.received_messages[0].message.message_id == mid and ACK_ID.match(a2).group(2) == "2"  # type: ignore[union-attr]
        outbox.put(pb.StreamingPullRequest(ack_ids=[a1]))  # stale: ignored ...
        outbox.put(pb.StreamingPullRequest(modify_deadline_ack_ids=[a2], modify_deadline_seconds=[45]))
        wait_for(lambda: (rows(warehouse, uid)[mid][1] or 0) > clock() + 35)  # ... the later change applied after it
        assert rows(warehouse, uid)[mid][0] == 2  # still there: the stale ack did nothing
        outbox.put(pb.StreamingPullRequest(ack_ids=[a2]))
        wait_for(lambda: not rows(warehouse, uid))
    finally:
        outbox.put(None)
        responses.cancel()


# -- (d) without exactly-once: as before ------------------------------------------------------------
def test_without_exactly_once_acks_stay_best_effort(server, gpub, gsub, clock: Clock, warehouse: str) -> None:
    gpub.create_topic(name=T)
    s = sub_name("plain")
    gsub.create_subscription(request={"name": s, "topic": T, "ack_deadline_seconds": 10})
    for f in [gpub.publish(T, f"m{i}".encode()) for i in range(5)]:
        f.result(timeout=30)
    seen: list[tuple[Any, bool]] = []

    def callback(message: Any) -> None:
        seen.append((message.ack_with_response().result(timeout=30), message.exactly_once_enabled))

    future = gsub.subscribe(s, callback)
    try:
        wait_for(lambda: len(seen) >= 5, 30)
    finally:
        future.cancel()
        future.result(timeout=30)
    assert seen == [(AcknowledgeStatus.SUCCESS, False)] * 5
    wait_for(lambda: not rows(warehouse, sub_uid(server, s)))

    # a superseded ack id is ignored without an error (no reads, no per-id answer)
    gpub.publish(T, b"y").result(timeout=30)
    first = pull_one(gsub, s)
    clock.offset += 11
    second = pull_one(gsub, s)
    gsub.acknowledge(subscription=s, ack_ids=[first.ack_id])
    gsub.modify_ack_deadline(subscription=s, ack_ids=[first.ack_id], ack_deadline_seconds=30)
    assert rows(warehouse, sub_uid(server, s))[second.message.message_id][0] == 2
    gsub.acknowledge(subscription=s, ack_ids=[second.ack_id])
    assert rows(warehouse, sub_uid(server, s)) == {}
