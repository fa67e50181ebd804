"""Push workers against the driver's pool server and real endpoints on 127.0.0.1.

The first tests run a worker in a thread (no Spark); the last ones run the pool's Spark job."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time

import aiohttp
import pyarrow as pa
import pytest

from deltabus.push.ledger import PushLedger
from deltabus.push.pool import POOL_GROUP, PoolServer, PushPool
from deltabus.push.pool_tls import make_certificate
from deltabus.push.sender import REQUEST_SCHEMA
from deltabus.push.wire import AUTH_HEADER, PENDING_HEADER, WORKER_HEADER
from deltabus.push.worker import Worker, pool_partition
from tests.endpoints import Behaviour, Endpoint

# Not OUT_OF_PROCESS: in a child pytest (tests/background.py) the pool job's first delivery
# timed out in 2 runs of 3 (2026-11-27: no outcome in 60 s, its Spark task running), while
# in the session it always passed. Not yet explained.

NOW = dt.datetime(2026, 11, 22, 12, 0, 0, 250000, tzinfo=dt.timezone.utc)


def requests(sub: str, url: str, ids, timeout: float = 10.0, lease_expires: dt.datetime | None = None) -> pa.Table:
    rows = [dict(sub_uid=sub, subscription=f"projects/p/subscriptions/{sub}", message_id=str(i), delivery_attempt=1,
                 endpoint=url, token=None, no_wrapper=False, write_metadata=False, timeout_seconds=timeout,
                 data=f"m{i}".encode(), attributes=[("k", "v")], ordering_key="", publish_time=NOW,
                 lease_expires=lease_expires) for i in ids]
    return pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)


class WorkerThread:
    def __init__(self, url: str, key: str, **kw) -> None:
        self.worker = Worker(url, key, **kw)
        self.pushed: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.pushed = asyncio.run(self.worker.run())

    def __enter__(self) -> "WorkerThread":
        self._thread.start()
        return self

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def __exit__(self, *exc: object) -> None:
        self.join(30)


def settle_all(d: PushLedger, n: int, timeout: float = 30.0) -> pa.Table:
    got, end = [], time.monotonic() + timeout
    while sum(t.num_rows for t in got) < n and time.monotonic() < end:
        got.append(d.collect().outcomes)
        time.sleep(0.02)
    return pa.concat_tables(got)


@pytest.fixture
def server():
    d = PushLedger()
    s = PoolServer(d, per_sub=64)
    yield s
    s.close()
    s.stop()


def test_a_worker_pushes_everything_and_reports_each_outcome(server):
    with Endpoint(Behaviour(lambda r, n: (204 if n % 10 else 500, 0.0))) as ep, WorkerThread(server.url, server.key, per_sub=64) as w:
        server.ledger.submit("a", requests("a", ep.url, range(500)))
        server.notify()
        out = settle_all(server.ledger, 500)
        server.close()
        assert w.join(30) and w.pushed == 500
    assert sorted(out["message_id"].to_pylist(), key=int) == [str(i) for i in range(500)]
    assert out["outcome"].to_pylist().count("nack") == 50 and set(out["status"].to_pylist()) == {204, 500}
    bodies = [json.loads(r.body) for r in ep.snapshot()]
    assert len(bodies) == 500 and {b["message"]["publishTime"] for b in bodies} == {"2026-11-22T12:00:00.250Z"}
    assert server.ledger.outstanding() == 0


def test_a_slow_subscription_does_not_hold_back_a_fast_one_in_the_same_worker(server):
    with Endpoint(Behaviour(lambda r, n: (204, 3.0))) as slow, Endpoint() as fast, \
            WorkerThread(server.url, server.key, per_sub=64, concurrency=8) as w:
        server.ledger.submit("slow", requests("slow", slow.url, range(200)))
        server.ledger.submit("fast", requests("fast", fast.url, range(1000, 1400)))
        server.notify()
        started = time.monotonic()
        while len(fast.snapshot()) < 400 and time.monotonic() - started < 20:
            time.sleep(0.05)
        took = time.monotonic() - started
        assert len(fast.snapshot()) == 400
        assert len(slow.snapshot()) <= 16  # two rounds of its 8 senders at most
        server.ledger.drop_queued()
        server.close()
        w.join(30)
    assert took < 3.0 * 2  # not paced by the slow endpoint's 3 s answers


def test_a_push_whose_lease_ran_out_while_it_waited_is_not_sent(server):
    """Its message is due again under a new attempt: sending the old one would push it twice."""
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60)
    with Endpoint() as ep, WorkerThread(server.url, server.key, per_sub=64) as w:
        server.ledger.submit("a", requests("a", ep.url, range(5), lease_expires=past))
        server.ledger.submit("a", requests("a", ep.url, range(5, 8), lease_expires=future))
        server.notify()
        out = settle_all(server.ledger, 8)
        server.close()
        assert w.join(30) and w.pushed == 3
    outcome = dict(zip(out["message_id"].to_pylist(), out["outcome"].to_pylist()))
    assert outcome == {**{str(i): "expired" for i in range(5)}, **{str(i): "ack" for i in range(5, 8)}}
    assert sorted(json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()) == ["5", "6", "7"]


def test_the_pool_server_refuses_a_wrong_key_and_bad_counts(server):
    async def ask(headers):
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{server.url}/work", headers=headers) as r:
                return r.status, await r.text()

    assert asyncio.run(ask({AUTH_HEADER: "wrong", WORKER_HEADER: "w"}))[0] == 403
    status, text = asyncio.run(ask({AUTH_HEADER: server.key, WORKER_HEADER: "w", PENDING_HEADER: "[1"}))
    assert status == 400 and PENDING_HEADER in text


@pytest.fixture
def tls_server():
    s = PoolServer(PushLedger(), per_sub=64, tls=make_certificate("127.0.0.1", dt.datetime.now(dt.timezone.utc)))
    yield s
    s.close()
    s.stop()


def test_over_tls_a_pinned_worker_gets_work_and_reports_every_outcome(tls_server):
    assert tls_server.url.startswith("https://127.0.0.1:") and tls_server.pin is not None
    with Endpoint(Behaviour(lambda r, n: (204 if n % 10 else 500, 0.0))) as ep, \
            WorkerThread(tls_server.url, tls_server.key, pin=tls_server.pin, per_sub=64) as w:
        tls_server.ledger.submit("a", requests("a", ep.url, range(200)))
        tls_server.notify()
        out = settle_all(tls_server.ledger, 200)
        tls_server.close()
        assert w.join(30) and w.pushed == 200
    assert sorted(out["message_id"].to_pylist(), key=int) == [str(i) for i in range(200)]
    assert out["outcome"].to_pylist().count("nack") == 20 and tls_server.ledger.outstanding() == 0


def test_a_worker_pinned_to_another_certificate_sends_the_pool_nothing_and_stops(tls_server, caplog):
    """An impostor: the handshake works, the pin does not match, so not even the key is sent.
    The worker stops at once instead of retrying until it is orphaned (30 s)."""
    other = make_certificate("127.0.0.1", dt.datetime.now(dt.timezone.utc)).certificate.pin
    with Endpoint() as ep:
        tls_server.ledger.submit("a", requests("a", ep.url, range(10)))
        tls_server.notify()
        started = time.monotonic()
        with WorkerThread(tls_server.url, tls_server.key, pin=other) as w:
            assert w.join(10)
        assert time.monotonic() - started < 5 and w.pushed == 0
        assert tls_server.ledger.queued() == 10 and tls_server.ledger.outstanding() == 10  # none handed out
        assert ep.snapshot() == []
    assert "certificate other than the pinned one" in caplog.text and tls_server.key not in caplog.text


def test_a_plain_http_client_gets_no_work_from_the_tls_pool(tls_server):
    tls_server.ledger.submit("a", requests("a", "http://127.0.0.1:9/", range(5)))
    tls_server.notify()
    plain = tls_server.url.replace("https://", "http://")

    async def ask() -> int:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{plain}/work", headers={AUTH_HEADER: tls_server.key, WORKER_HEADER: "w"}) as r:
                return r.status

    with pytest.raises(aiohttp.ClientError):  # the server drops the connection at its TLS handshake
        asyncio.run(ask())
    assert tls_server.ledger.queued() == 5


def test_the_pool_partition_ships_the_pin_with_its_closure_and_its_worker_uses_it(tls_server):
    """What Spark does with the pool's body: pickle it on the driver, run it on an executor."""
    from pyspark import cloudpickle

    body = cloudpickle.loads(cloudpickle.dumps(pool_partition(tls_server.url, tls_server.key, 8, pin=tls_server.pin)))
    with Endpoint() as ep:
        tls_server.ledger.submit("a", requests("a", ep.url, range(50)))
        tls_server.notify()
        result: list[pa.RecordBatch] = []
        runner = threading.Thread(target=lambda: result.extend(body(iter([pa.record_batch({"id": [0]})]))), daemon=True)
        runner.start()
        out = settle_all(tls_server.ledger, 50)
        tls_server.close()
        runner.join(30)
    assert out.num_rows == 50 and result[0].column("pushed").to_pylist() == [50] and len(ep.snapshot()) == 50


def test_a_worker_whose_driver_is_gone_stops_on_its_own():
    d = PushLedger()
    s = PoolServer(d)
    url, key = s.url, s.key
    s.stop()  # the driver died: nothing answers any more
    with WorkerThread(url, key, orphan_after=1.0) as w:
        assert w.join(15)
    assert w.pushed == 0


@pytest.mark.spark
def test_the_pool_job_delivers_and_comes_back_after_its_spark_job_is_cancelled(spark):
    with Endpoint() as ep:
        pool = PushPool(spark, workers=2)
        try:
            assert pool.workers == 1  # the test session is local[2]: one slot stays for micro-batches
            assert pool.url.startswith("http://127.0.0.1:")  # a local master on loopback: plain HTTP
            pool.submit("a", requests("a", ep.url, range(300)))
            out = settle_all(pool.ledger, 300, timeout=60)
            assert out.num_rows == 300 and set(out["outcome"].to_pylist()) == {"ack"}
            # An executor lost: the workers' Spark job fails; the pool starts it again.
            spark.sparkContext.cancelJobGroup(POOL_GROUP)
            end = time.monotonic() + 30
            while pool.restarts == 0 and time.monotonic() < end:
                time.sleep(0.1)
            assert pool.restarts == 1
            pool.submit("a", requests("a", ep.url, range(300, 400)))
            later = settle_all(pool.ledger, 100, timeout=60)
            assert sorted(later["message_id"].to_pylist(), key=int) == [str(i) for i in range(300, 400)]
        finally:
            pool.close()
    assert len(ep.snapshot()) == 400
