"""`deltabus serve` StreamingPull: the REAL google-cloud-pubsub client's subscribe() (and a raw
grpc.aio client where the test needs to see the wire) against a real server on 127.0.0.1.

Flow control, acks on the stream and by unary calls, nack and redelivery, two clients
splitting a subscription, 200 open streams on one server (no thread each), ordering keys,
the group commit folding many callers into few rounds, and a SIGKILLed server process
restarted mid-stream: every published message acked, nothing lost.
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import grpc
import grpc.aio
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pb

from deltabus.server import streaming
from deltabus.server.app import ServerThread
from tests.conftest import delivery_state
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

# Its tests run in a pytest process of their own beside the session's others (tests/background.py):
# about 35 s: a server and the google client in process, with PUBSUB_EMULATOR_HOST set.
OUT_OF_PROCESS = True

T = f"projects/{PROJECT}/topics/stream-topic"
S = f"projects/{PROJECT}/subscriptions/stream-sub"


@pytest.fixture
def topic_sub(gpub, gsub) -> tuple[str, str]:
    gpub.create_topic(name=T)
    gsub.create_subscription(name=S, topic=T)
    return T, S


def publish(gpub: Any, n: int, **attrs: str) -> list[str]:
    futures = [gpub.publish(T, f"m{i}".encode(), i=str(i), **attrs) for i in range(n)]
    return [f.result(timeout=60) for f in futures]


class Collector:
    """A subscribe() callback counting deliveries per message id; `nack_first` nacks each
    message's first delivery."""

    def __init__(self, expect: int, nack_first: bool = False) -> None:
        self.expect = expect
        self.nack_first = nack_first
        self.count: collections.Counter[str] = collections.Counter()
        self.acked: set[str] = set()
        self.order: list[tuple[str, int]] = []
        self.attempts: dict[str, list[int]] = collections.defaultdict(list)
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, m: Any) -> None:
        with self.lock:
            self.count[m.message_id] += 1
            first = self.count[m.message_id] == 1
            self.order.append((m.ordering_key, int(m.attributes["i"])))
            if self.nack_first and first:
                m.nack()
                return
            self.acked.add(m.message_id)
            if len(self.acked) >= self.expect:
                self.done.set()
        m.ack()


def hub(server: ServerThread) -> streaming.StreamHub:
    found = streaming.hub_of(server.state)
    assert found is not None
    return found


def stop(future: Any) -> None:
    future.cancel()
    try:
        future.result(timeout=10)
    except Exception:
        pass


def test_subscribe_acks_thousands_exactly_once_under_flow_control(serve_thread, topic_sub, gpub, gsub) -> None:
    ids = publish(gpub, 3000)
    got = Collector(3000)
    future = gsub.subscribe(S, got, flow_control=pubsub_v1.types.FlowControl(max_messages=100))
    try:
        assert got.done.wait(90), f"{len(got.acked)} of 3000 acked"
    finally:
        stop(future)
    assert set(got.count) == set(ids)
    assert set(got.count.values()) == {1}  # each message delivered once, acked once
    # nothing left: the acks reached the table (they are unary calls the client sends in batches)
    give_up = time.monotonic() + 20
    while gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages and time.monotonic() < give_up:
        time.sleep(0.2)
    assert list(gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages) == []


def test_nacked_messages_come_again_and_are_then_acked(serve_thread, topic_sub, gpub, gsub) -> None:
    ids = publish(gpub, 40)
    got = Collector(40, nack_first=True)
    future = gsub.subscribe(S, got, flow_control=pubsub_v1.types.FlowControl(max_messages=10))
    try:
        assert got.done.wait(60), f"{len(got.acked)} of 40 acked"
    finally:
        stop(future)
    assert got.acked == set(ids)
    assert all(got.count[m] >= 2 for m in ids)  # once nacked, once acked


def test_two_clients_split_one_subscription(serve_thread, topic_sub, gpub) -> None:
    ids = publish(gpub, 1000)
    clients = [pubsub_v1.SubscriberClient(), pubsub_v1.SubscriberClient()]
    got = [Collector(10_000), Collector(10_000)]
    futures = [c.subscribe(S, g, flow_control=pubsub_v1.types.FlowControl(max_messages=50)) for c, g in zip(clients, got)]
    try:
        give_up = time.monotonic() + 60
        while len(got[0].acked | got[1].acked) < 1000 and time.monotonic() < give_up:
            time.sleep(0.1)
    finally:
        for f in futures:
            stop(f)
        for c in clients:
            c.close()
    assert got[0].acked | got[1].acked == set(ids)
    assert got[0].acked and got[1].acked  # both took part
    total = got[0].count + got[1].count
    assert sum(total.values()) == 1000  # nothing doubled (the leases never ran out)


def test_ordering_keys_arrive_in_order_through_subscribe(serve_thread, gpub, gsub) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "enable_message_ordering": True})
    client = pubsub_v1.PublisherClient(publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True))
    try:
        futures = [client.publish(T, f"m{i}".encode(), ordering_key=f"k{i % 3}", i=str(i)) for i in range(150)]
        for f in futures:
            f.result(timeout=60)
    finally:
        client.stop()
    got = Collector(150)
    future = gsub.subscribe(S, got, flow_control=pubsub_v1.types.FlowControl(max_messages=20))
    try:
        assert got.done.wait(60), f"{len(got.acked)} of 150 acked"
    finally:
        stop(future)
    for key in ("k0", "k1", "k2"):
        seq = [i for k, i in got.order if k == key]
        assert seq == sorted(seq) and len(seq) == 50, key


# -- the wire, through a raw grpc.aio client -------------------------------------------------
def _method(name: str) -> str:
    return f"/google.pubsub.v1.Subscriber/{name}"


class RawStream:
    """One StreamingPull call; a background task reads its responses into a queue (cancelling
    a pending read would cancel the whole call)."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.responses: asyncio.Queue[Any] = asyncio.Queue()
        self.error: grpc.aio.AioRpcError | None = None
        self.task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                resp = await self.call.read()
                if resp is grpc.aio.EOF:
                    break
                await self.responses.put(resp)
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        except asyncio.CancelledError:
            pass
        await self.responses.put(None)

    async def write(self, **fields: Any) -> None:
        await self.call.write(pb.StreamingPullRequest(**fields))

    async def read_n(self, n: int, timeout: float) -> list[Any]:
        """Up to n received messages within `timeout` seconds (fewer when the time runs out)."""
        got: list[Any] = []
        give_up = time.monotonic() + timeout
        while len(got) < n:
            try:
                resp = await asyncio.wait_for(self.responses.get(), max(0.0, give_up - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if resp is None:
                await self.responses.put(None)
                break
            got.extend(resp.received_messages)
        return got

    async def first_response(self, timeout: float) -> Any:
        return await asyncio.wait_for(self.responses.get(), timeout)

    async def ended(self, timeout: float) -> grpc.aio.AioRpcError | None:
        await asyncio.wait_for(asyncio.shield(self.task), timeout)
        return self.error

    def cancel(self) -> None:
        self.call.cancel()


async def _open(channel: grpc.aio.Channel, **first: Any) -> RawStream:
    call = channel.stream_stream(
        _method("StreamingPull"), request_serializer=pb.StreamingPullRequest.serialize,
        response_deserializer=pb.StreamingPullResponse.deserialize,
    )()
    await call.write(pb.StreamingPullRequest(subscription=S, stream_ack_deadline_seconds=first.pop("deadline", 60), **first))
    return RawStream(call)


def test_the_server_holds_a_stream_to_its_outstanding_limits(serve_thread, topic_sub, gpub) -> None:
    """max_outstanding_messages counts leased-and-unacked messages; a unary ack frees room
    on the stream that holds the message, a nack on the stream frees it too; subscription
    properties are filled; a bad modack on the stream ends it with INVALID_ARGUMENT."""
    ids = publish(gpub, 20)

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serve_thread.port}") as ch:
            st = await _open(ch, max_outstanding_messages=5)
            first = await st.read_n(5, 10)
            assert len(first) == 5
            assert await st.read_n(1, 1.5) == []  # full: nothing more while 5 are outstanding
            ack = ch.unary_unary(_method("Acknowledge"), request_serializer=pb.AcknowledgeRequest.serialize,
                                 response_deserializer=lambda b: b)
            await ack(pb.AcknowledgeRequest(subscription=S, ack_ids=[m.ack_id for m in first[:2]]))
            more = await st.read_n(2, 10)
            assert len(more) == 2
            assert await st.read_n(1, 1.0) == []
            # a nack on the stream: room for one, and the nacked message may come again
            await st.write(modify_deadline_ack_ids=[more[0].ack_id], modify_deadline_seconds=[0])
            again = await st.read_n(1, 10)
            assert len(again) == 1
            await st.write(modify_deadline_ack_ids=[again[0].ack_id], modify_deadline_seconds=[1, 2])
            err = await st.ended(10)
            assert err is not None and err.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "modify_deadline_seconds" in (err.details() or "")
            seen = {m.message.message_id for m in first + more + again}
            assert seen <= set(ids)

    asyncio.run(run())


def test_the_byte_limit_and_the_subscription_properties(serve_thread, gpub, gsub) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "enable_message_ordering": True})
    publish(gpub, 10)  # ~1 KiB each below

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serve_thread.port}") as ch:
            st = await _open(ch, max_outstanding_bytes=1)  # the first batch passes the limit; then nothing
            resp = await st.first_response(10)
            assert resp.subscription_properties.message_ordering_enabled
            assert not resp.subscription_properties.exactly_once_delivery_enabled
            n = len(resp.received_messages)
            assert 1 <= n <= 10
            rest = await st.read_n(10 - n, 5)  # what the first round did not take comes too ...
            await asyncio.get_running_loop().run_in_executor(None, publish, gpub, 5)
            assert await st.read_n(1, 1.5) == []  # ... but the new ones wait: the bytes are over the limit
            await st.write(ack_ids=[m.ack_id for m in list(resp.received_messages) + rest])
            assert len(await st.read_n(5, 10)) >= 1
            st.cancel()

    asyncio.run(run())


def test_two_hundred_open_streams_on_one_server(serve_thread, topic_sub, gpub) -> None:
    """200 StreamingPull calls at once: each waits on the loop (no thread each), new messages
    reach them, and their lease asks are folded into far fewer group-commit rounds."""
    threads_before = threading.active_count()
    commits = None

    async def run() -> tuple[int, int, list[str]]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serve_thread.port}") as ch:
            calls = [await _open(ch, max_outstanding_messages=2) for _ in range(200)]
            give_up = time.monotonic() + 20
            while hub(serve_thread).open_streams < 200 and time.monotonic() < give_up:
                await asyncio.sleep(0.05)
            open_streams, threads = hub(serve_thread).open_streams, threading.active_count()
            nonlocal commits
            commits = hub(serve_thread).commits
            rounds0, calls0 = commits.rounds, commits.calls
            await asyncio.get_running_loop().run_in_executor(None, publish, gpub, 300)
            got: list[str] = []

            async def drain(st: RawStream) -> None:
                while True:
                    resp = await st.responses.get()
                    if resp is None:
                        return
                    got.extend(m.message.message_id for m in resp.received_messages)
                    await st.write(ack_ids=[m.ack_id for m in resp.received_messages])

            tasks = [asyncio.ensure_future(drain(c)) for c in calls]
            deadline = time.monotonic() + 30
            while len(set(got)) < 300 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for c in calls:
                c.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert commits.calls - calls0 > commits.rounds - rounds0  # callers share rounds
            return open_streams, threads, got

    open_streams, threads, got = asyncio.run(run())
    assert open_streams == 200
    assert threads - threads_before < 50  # the server's pool and the client's, not one per stream
    assert len(set(got)) == 300
    assert len(got) == 300  # each message to one stream only


def test_streams_end_unavailable_when_the_server_stops(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltabus.server.settings import ServeSettings

    server = ServerThread(ServeSettings(warehouse=warehouse, port=0, grace_seconds=5.0)).start()
    stopper = threading.Thread(target=server.stop)
    try:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{server.port}")
        p, s = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        p.create_topic(name=T)
        s.create_subscription(name=S, topic=T)
        p.stop()
        s.close()

        async def run() -> grpc.StatusCode:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
                st = await _open(ch)
                give_up = time.monotonic() + 10
                while hub(server).open_streams < 1 and time.monotonic() < give_up:
                    await asyncio.sleep(0.02)
                started = time.monotonic()
                stopper.start()
                err = await st.ended(10)
                assert time.monotonic() - started < 4  # ended at once, not after the 5 s grace
                return grpc.StatusCode.OK if err is None else err.code()

        assert asyncio.run(run()) is grpc.StatusCode.UNAVAILABLE
    finally:
        if stopper.ident is not None:  # started: stop() once only
            stopper.join()
        else:
            server.stop()


# -- a real server process, SIGKILLed mid-stream ---------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(warehouse: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltabus.cli", "serve", "--warehouse", warehouse, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert re.search(r" on 127\.0\.0\.1:\d+,", line), line
    return proc


def test_a_server_sigkilled_mid_stream_and_restarted_loses_nothing(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    proc = _start(warehouse, port)
    procs = [proc]
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
    pubc, subc = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    future = None
    try:
        pubc.create_topic(name=T)
        subc.create_subscription(name=S, topic=T)
        ids = [f.result(timeout=30) for f in [pubc.publish(T, f"m{i}".encode(), i=str(i)) for i in range(600)]]
        slow = threading.Event()

        got = Collector(600)

        def callback(m: Any) -> None:
            if not slow.is_set():
                time.sleep(0.002)
            got(m)

        # leases of 10 s (the client's stream deadline follows max_duration_per_lease_extension)
        flow = pubsub_v1.types.FlowControl(max_messages=50, max_duration_per_lease_extension=10)
        future = subc.subscribe(S, callback, flow_control=flow)
        give_up = time.monotonic() + 30
        while len(got.acked) < 150 and time.monotonic() < give_up:
            time.sleep(0.01)
        assert len(got.acked) >= 150
        proc.send_signal(signal.SIGKILL)  # mid-stream: leases out, acks in flight
        proc.wait()
        slow.set()
        proc = _start(warehouse, port)
        procs.append(proc)
        assert got.done.wait(60), f"{len(got.acked)} of 600 acked after the restart"
        assert got.acked == set(ids)
        stop(future)
        future = None
        # every ack reached the table: nothing is left to deliver once the leases end
        from deltabus.storage import open_engine

        engine = open_engine(warehouse, engine="delta-rs")
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            left = delivery_state(engine.snapshot("deliveries").read(["sub_uid", "message_id"])).num_rows
            if left == 0:
                break
            time.sleep(0.2)
        assert left == 0, f"{left} deliveries rows left unacked"
    finally:
        if future is not None:
            stop(future)
        subc.close()
        pubc.stop()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def test_pull_and_streaming_pull_refuse_a_push_subscription(serve_thread, gpub, gsub) -> None:
    from google.api_core import exceptions as gexc

    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "push_config": {"push_endpoint": "http://127.0.0.1:9/push"}})
    publish(gpub, 3)
    with pytest.raises(gexc.FailedPrecondition, match="push subscription"):
        gsub.pull(subscription=S, max_messages=5, return_immediately=True)

    async def run() -> grpc.aio.AioRpcError | None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serve_thread.port}") as ch:
            st = await _open(ch)
            return await st.ended(10)

    err = asyncio.run(run())
    assert err is not None and err.code() is grpc.StatusCode.FAILED_PRECONDITION


def test_unary_pull_and_a_stream_share_a_subscription_without_doubles(serve_thread, topic_sub, gpub, gsub) -> None:
    ids = publish(gpub, 200)
    got = Collector(10_000)
    future = gsub.subscribe(S, got, flow_control=pubsub_v1.types.FlowControl(max_messages=20))
    pulled: list[str] = []
    try:
        give_up = time.monotonic() + 30
        while len(got.acked) + len(pulled) < 200 and time.monotonic() < give_up:
            r = gsub.pull(subscription=S, max_messages=10, return_immediately=True).received_messages
            if r:
                pulled += [m.message.message_id for m in r]
                gsub.acknowledge(subscription=S, ack_ids=[m.ack_id for m in r])
    finally:
        stop(future)
    assert set(pulled) | got.acked == set(ids)
    assert len(pulled) + sum(got.count.values()) == 200


def test_another_writers_publish_wakes_the_streams_through_the_log_watcher(serve_thread, topic_sub, gsub, warehouse: str) -> None:
    """A message published straight into the warehouse (not through the server) reaches an
    open stream, and the server's one watcher thread is what noticed the commit."""
    from deltabus import PublisherClient

    got = Collector(1)
    future = gsub.subscribe(S, got)
    try:
        give_up = time.monotonic() + 10
        while hub(serve_thread).open_streams < 1 and time.monotonic() < give_up:
            time.sleep(0.02)
        time.sleep(0.3)  # the stream found nothing and waits
        wakeups = hub(serve_thread).wakeups
        with PublisherClient(warehouse=warehouse) as other:
            (mid,) = other.publish_batch(T, [{"data": b"from elsewhere", "attributes": {"i": "0"}}])
        assert got.done.wait(10)
        assert got.acked == {mid}
        assert hub(serve_thread).wakeups > wakeups
    finally:
        stop(future)


def test_acks_sent_on_a_stream_apply_even_when_it_is_cancelled_right_after(serve_thread, topic_sub, gpub, warehouse: str) -> None:
    from deltabus.storage import open_engine

    publish(gpub, 30)

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serve_thread.port}") as ch:
            st = await _open(ch)
            got = await st.read_n(30, 10)
            assert len(got) == 30
            acked.extend(m.message.message_id for m in got)
            # new messages set the stream leasing again, so the acks queue behind that round ...
            await asyncio.get_running_loop().run_in_executor(None, publish, gpub, 30)
            await st.write(ack_ids=[m.ack_id for m in got])
            await asyncio.sleep(0.005)
            st.cancel()  # ... and the client goes at once: the stream ends

    acked: list[str] = []
    asyncio.run(run())
    engine = open_engine(warehouse, engine="delta-rs")

    def left() -> set[str]:
        return set(delivery_state(engine.snapshot("deliveries").read(["sub_uid", "message_id"]))["message_id"].to_pylist()) & set(acked)

    give_up = time.monotonic() + 10
    while left() and time.monotonic() < give_up:
        time.sleep(0.05)
    assert left() == set()  # every ack sent on the stream committed
