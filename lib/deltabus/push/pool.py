"""Long-lived push workers on the executors, fed by the driver over HTTP.

Started once per push job: one Spark job (``mapInArrow`` over ``workers`` partitions) whose
tasks are push workers (``worker.Worker``) that live as long as the job does. The driver
serves them work from the ``PushLedger`` (``ledger.py``) on a small HTTP server (127.0.0.1 on a local
master; ``spark.driver.host`` on a cluster, the address executors already reach the
driver at). Every request carries a random key made for this run, so nothing else on the
network can take pushes or report outcomes. Off loopback (any master but a local one)
the link is HTTPS with a certificate made for the run, which the workers pin
(``pool_tls.py``): assignments carry payloads and OIDC tokens, and the key itself must not
cross a network in clear.

Why not one Spark job per batch of pushes: measured here, each such job cost more JVM
time than the pushes themselves (DataFrame creation, Arrow round trips through the JVM,
task launch), and a new connection pool per job. Like Spark Streaming's receivers, the
workers hold task slots for the whole run: the stream's own micro-batches need at least
one more, so a master with fewer than two slots is refused.

If the workers' Spark job fails (an executor lost), what they held is given up on (the
leases expire and the messages are redelivered) and the job is started again.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
from aiohttp import web

from .._server_thread import ServerThread
from ..errors import InvalidArgument
from ..timestamps import utc
from .ledger import Collected, PushLedger
from .pool_tls import CertPin, PoolTls, link_uses_tls, make_certificate
from .sender import MAX_CONCURRENCY
from .wire import AUTH_HEADER, PENDING_HEADER, RESULT_SCHEMA, WORKER_HEADER, from_ipc, to_ipc
from .worker import PER_SUB_ROWS, pool_partition

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = logging.getLogger("deltabus.deliver")

LONG_POLL = 0.5  # seconds a worker's ask for work waits when there is none
HAND_OUT_LIMIT = 2048  # rows in one assignment
POOL_GROUP = "deltabus-push-workers"


def encrypted_rpc(crypto_enabled: str, authenticate: str) -> bool:
    """Whether Spark's own RPC (which carries the workers' task, the run key inside it) is
    authenticated and encrypted: ``spark.authenticate`` and ``spark.network.crypto.enabled``."""
    return crypto_enabled.strip().lower() == "true" and authenticate.strip().lower() == "true"


def pool_size(wanted: int, slots: int) -> int:
    """Workers to start given the master's task slots: one slot stays for micro-batches."""
    if slots < 2:
        raise InvalidArgument(
            "spark.master",
            f"the push job needs at least 2 task slots (push workers plus the stream's micro-batches), got {slots}; "
            "use e.g. local[2] or more",
        )
    return max(1, min(wanted, slots - 1))


class PoolServer:
    """The driver's HTTP side: hands out work from a PushLedger and takes outcomes back.

    With `tls` it serves HTTPS only, ``url`` starts with ``https://`` and ``pin`` is what the
    workers must pin; without, plain HTTP and ``pin`` is None."""

    def __init__(self, ledger: PushLedger, *, host: str = "127.0.0.1", advertise: str | None = None,
                 per_sub: int = PER_SUB_ROWS, key: str | None = None, tls: PoolTls | None = None) -> None:
        self.ledger = ledger
        self.per_sub = per_sub
        self.key = key or secrets.token_urlsafe(32)
        self.pin: CertPin | None = tls.certificate.pin if tls is not None else None
        self.closing = False
        self._waiters: set[asyncio.Future[None]] = set()
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/work", self._work)
        app.router.add_post("/outcomes", self._outcomes)
        self._server = ServerThread(
            app, host, 0, name="deltabus-push-pool", ssl_context=tls.context if tls is not None else None
        ).start()
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://{advertise or host}:{self._server.port}"

    def notify(self) -> None:
        """New work was queued (or the pool is closing): wake the waiting long polls."""
        self._server.call_soon(self._wake)

    def close(self) -> None:
        self.closing = True
        self.notify()

    def stop(self) -> None:
        self._server.stop()

    def _authorised(self, request: web.Request) -> bool:
        return hmac.compare_digest(request.headers.get(AUTH_HEADER, ""), self.key)

    def _wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    async def _work(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.Response(status=403)
        worker = request.headers.get(WORKER_HEADER, "")
        try:
            held = {str(k): int(v) for k, v in json.loads(request.headers.get(PENDING_HEADER, "{}")).items()}
        except (ValueError, AttributeError):
            return web.Response(status=400, text=f"{PENDING_HEADER}: must be a JSON object of counts")
        end = time.monotonic() + LONG_POLL
        while True:
            table = self.ledger.hand_out(worker, held, per_sub=self.per_sub, limit=HAND_OUT_LIMIT)
            if table is not None:
                return web.Response(body=to_ipc(table), content_type="application/vnd.apache.arrow.stream")
            if self.closing:
                return web.Response(status=410)
            left = end - time.monotonic()
            # Long-poll only a worker that holds nothing: a busy one must get back to its
            # sends and ask again when it runs low.
            if any(held.values()) or self.ledger.has_queued() or left <= 0:
                return web.Response(status=204)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.add(fut)
            try:
                await asyncio.wait_for(fut, left)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(fut)

    async def _outcomes(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.Response(status=403)
        try:
            results = from_ipc(await request.read(), RESULT_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            return web.Response(status=400, text=f"outcomes: not an Arrow stream of results ({type(exc).__name__})")
        self.ledger.settle(results)
        return web.Response(status=204)


class PushPool:
    """The push workers' Spark job and the driver's pool server that feeds them.

    The link is plain HTTP on 127.0.0.1 for a local master only; for any other master
    (``spark://127.0.0.1:…`` included) it is HTTPS with a certificate made here, valid
    from `wall`'s now (``pool_tls.link_uses_tls`` decides). ``url`` says which."""

    def __init__(
        self,
        spark: "SparkSession",
        *,
        workers: int,
        ledger: PushLedger | None = None,
        concurrency: int = MAX_CONCURRENCY,
        per_sub: int = PER_SUB_ROWS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.spark = spark
        sc = spark.sparkContext
        self.workers = pool_size(workers, sc.defaultParallelism)
        self.ledger = ledger or PushLedger(clock=clock)
        self.concurrency = concurrency
        master = sc.master or ""
        if master.startswith("local"):
            advertise = bind = "127.0.0.1"
        else:
            # Spark sets spark.driver.host on every running context; its absence is a broken conf.
            advertise = spark.conf.get("spark.driver.host") or ""
            if not advertise:
                raise InvalidArgument("spark.driver.host", "must be set: push workers reach the driver there")
            bind = spark.conf.get("spark.driver.bindAddress", advertise) or advertise
        tls = make_certificate(advertise, utc(wall())) if link_uses_tls(master, bind) else None
        self.server = PoolServer(self.ledger, host=bind, advertise=advertise, per_sub=per_sub, tls=tls)
        self.url = self.server.url
        if tls is not None:
            log.info("push pool at %s (TLS, per-run certificate)", self.url)
            if not encrypted_rpc(spark.conf.get("spark.network.crypto.enabled", "false") or "",
                                 spark.conf.get("spark.authenticate", "false") or ""):
                # The run key and the pin reach the executors inside the workers' task, over
                # Spark's own RPC: without Spark's encryption a listener there could take the
                # key and fetch assignments (payloads, tokens) from the pool itself.
                log.warning(
                    "push pool: Spark's RPC is not encrypted (spark.authenticate and spark.network.crypto.enabled "
                    "are off), and the pool's run key travels to the executors inside their task: turn both on "
                    "on a network you do not trust"
                )
            log.debug("push pool certificate SHA-256 %s", tls.certificate.pin.hex())
        else:
            log.info("push pool at %s (plain HTTP: local master on loopback)", self.url)
        self._closing = threading.Event()  # set by the job's thread, read by the workers' thread
        self.restarts = 0  # times the workers' Spark job was started again
        self._thread = threading.Thread(target=self._run, name="deltabus-push-workers", daemon=True)
        self._thread.start()
        log.info("started %d push workers", self.workers)

    # -- the job's side ---------------------------------------------------------------
    def submit(self, sub_uid: str, requests: pa.Table) -> None:
        self.ledger.submit(sub_uid, requests)
        self.server.notify()

    def collect(self) -> Collected:
        return self.ledger.collect()

    def outstanding(self) -> int:
        return self.ledger.outstanding()

    def queued(self) -> int:
        return self.ledger.queued()

    def wait_settled(self, timeout: float, cancel: threading.Event | None = None) -> bool:
        """Wait until every queued or handed-out request is settled (or given up on), at most
        `timeout` seconds, or until `cancel` is set. Whether all were settled."""
        end = time.monotonic() + timeout
        while self.ledger.outstanding():
            if time.monotonic() >= end or (cancel is not None and cancel.is_set()):
                return False
            time.sleep(0.02)
        return True

    def stop_handing_out(self) -> int:
        """The job is stopping: nothing more goes to the workers. Requests still queued are
        dropped (leased in Delta, they come back when their leases expire); each worker
        finishes what it holds, reports it and ends. How many were dropped."""
        dropped = self.ledger.drop_queued()
        if dropped:
            log.info("%d queued pushes not sent; their leases expire and they are redelivered", dropped)
        self._closing.set()
        self.server.close()
        return dropped

    def close(self, wait: float = 15.0) -> None:
        """Stop the workers: they finish what they hold (for up to `wait` seconds; then their
        Spark job is cancelled), then their Spark job ends."""
        self.stop_handing_out()
        self._thread.join(wait)
        if self._thread.is_alive():
            held = self.ledger.outstanding()
            log.info("cancelling the push workers (%d pushes unreported; their leases expire and they are redelivered)", held)
            self.spark.sparkContext.cancelJobGroup(POOL_GROUP)
            self._thread.join(10)
            self._await_killed_tasks(10.0)
        self.server.stop()

    def _await_killed_tasks(self, within: float) -> None:
        """Wait until the cancelled job's tasks have really ended. The job is failed as soon as
        the kill is sent, but a killed task still releases its broadcast lock when it ends; if
        spark.stop() has removed the broadcast by then, Spark logs a 'Block broadcast_N does
        not exist' trace (seen here on a second Ctrl-C during a drain)."""
        tracker = self.spark.sparkContext.statusTracker()
        end = time.monotonic() + within
        while time.monotonic() < end:
            stages = [
                info
                for job_id in tracker.getJobIdsForGroup(POOL_GROUP)
                for job in [tracker.getJobInfo(job_id)]
                if job is not None
                for stage_id in job.stageIds
                for info in [tracker.getStageInfo(stage_id)]
                if info is not None
            ]
            if all(info.numActiveTasks == 0 for info in stages):
                return
            time.sleep(0.05)

    # -- the workers' Spark job -------------------------------------------------------
    def _run(self) -> None:
        sc = self.spark.sparkContext
        sc.setLocalProperty("spark.scheduler.pool", "push")
        sc.setJobGroup(POOL_GROUP, f"deltabus push workers ({self.workers})", interruptOnCancel=True)
        body = pool_partition(self.server.url, self.server.key, self.concurrency, pin=self.server.pin)
        failures = 0
        while not self._closing.is_set():
            try:
                # pool_partition's body takes an Iterator (what Spark passes); the stub says Iterable.
                rows = self.spark.range(0, self.workers, 1, self.workers).mapInArrow(
                    body, "worker string, pushed long"  # type: ignore[arg-type]
                ).collect()
                if self._closing.is_set():
                    log.info("push workers stopped after %d pushes", sum(r.pushed for r in rows))
                    return
                log.warning("push workers ended on their own (driver unreachable?); starting them again")
            except Exception as exc:  # an executor lost, a worker crashed
                if self._closing.is_set():
                    return
                log.error("push workers failed: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            lost = self.ledger.workers_gone()
            if lost:
                log.error("%d pushes were with the failed workers; their leases expire and they are redelivered", lost)
            failures += 1
            end = time.monotonic() + min(30.0, 0.5 * 2**failures)
            while not self._closing.is_set() and time.monotonic() < end:
                time.sleep(0.1)
            self.restarts += 1
