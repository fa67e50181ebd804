"""The push job on a real Spark standalone cluster on this machine (group `cluster`).

One master and two workers on 127.0.0.1, each its own JVM, started from the pyspark install
(``deltabus.spark.standalone``) once for the module; executors run in their own processes
under the workers. ``jobs/deliver.py`` runs through ``./spark-submit.sh --master spark://…``
as a user runs it: the library goes to the executors on ``--py-files``, and the push workers
on the executors reach the driver's push pool over TLS (the driver's address is off
loopback here). Slow (a cluster driver and its executors start in tens of seconds on two
cores), hence its own group: ``./run-tests.sh -m cluster``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest
from aiohttp import web

from deltabus import PublisherClient, SubscriberClient
from deltabus._server_thread import ServerThread
from deltabus.spark.standalone import ClusterSettings, StandaloneCluster, process_tree
from tests.conftest import DELTA_SKIP, ROOT

# A cluster driver and its executors start in tens of seconds on an idle machine, minutes on
# a loaded one: each test gets more than the suite's 300 s.
pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(900)]

WORKERS = 2
# Task slots per worker. The push job holds delivery_partitions (2) slots for its push
# workers and needs one more for micro-batches, so a worker left alone after the other is
# lost must still have 3 (with 2, the re-run push worker would take the last slot and leave
# none for the stream's micro-batches).
CORES = 3
CLUSTER_CONFS = [
    # Wait for every executor before the job starts: the push job sizes its pool from
    # defaultParallelism, which counts only the cores registered so far.
    "--conf", f"spark.cores.max={WORKERS * CORES}",
    "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
    "--conf", "spark.executor.memory=1g",
    "--conf", "spark.ui.enabled=false",
    # As many partitions as task slots for shuffles and for Delta's snapshot state (defaults
    # 200 and 50): seen here, a delta-spark job on the defaults was still starting after six
    # minutes, its executors busy with stages of dozens of tasks on two cores.
    "--conf", f"spark.sql.shuffle.partitions={WORKERS * CORES}",
    "--conf", f"spark.databricks.delta.snapshotPartitions={WORKERS * CORES}",
]
DELIVER_SECONDS = 600  # --max-seconds: the job ends by itself before the test's timeout
ENGINES = [
    pytest.param("delta-rs"),
    pytest.param("delta-spark", marks=pytest.mark.skipif(DELTA_SKIP is not None, reason=str(DELTA_SKIP))),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with StandaloneCluster(
        ClusterSettings(workers=WORKERS, cores=CORES, memory="1g"),
        base_dir=tmp_path_factory.mktemp("cluster"), env=os.environ, conf_dir=ROOT / "conf",
    ) as c:
        yield c
    assert c.pids() == []  # every daemon, executor and Python worker ended


class Push(NamedTuple):
    message_id: str
    attempt: int
    peer_port: int
    arrived: float
    answered: float | None


class SlowEndpoint:
    """Answers 204 after `delay` seconds; records each push with the client's port and when
    it was answered (None while it is still in flight)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._lock = threading.Lock()
        self.pushes: list[Push] = []
        app = web.Application()
        app.router.add_post("/push", self._handle)
        self._server = ServerThread(app, name="cluster-test-endpoint")

    async def _handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        peer = request.transport.get_extra_info("peername") if request.transport else None
        with self._lock:
            index = len(self.pushes)
            self.pushes.append(Push(body["message"]["messageId"], int(body["deliveryAttempt"]),
                                    int(peer[1]) if peer else 0, time.time(), None))
        await asyncio.sleep(self.delay)
        with self._lock:
            self.pushes[index] = self.pushes[index]._replace(answered=time.time())
        return web.Response(status=204)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    def snapshot(self) -> list[Push]:
        with self._lock:
            return list(self.pushes)

    def __enter__(self) -> "SlowEndpoint":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


@contextlib.contextmanager
def deliver(cluster: StandaloneCluster, warehouse: str, engine: str, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``./spark-submit.sh --master spark://… jobs/deliver.py --until-idle``; killed (its whole
    process group) if the block ends with it still running: a job left behind would hold
    every core of the cluster and starve the next test's job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["PYTHONUNBUFFERED"] = "1"  # the job's log lines reach the file as they happen
    with open(log_path, "ab") as log:
        job = subprocess.Popen(
            [str(ROOT / "spark-submit.sh"), "--master", cluster.master_url, *CLUSTER_CONFS,
             "jobs/deliver.py", "--warehouse", warehouse, "--until-idle", "--allow-http", "--engine", engine,
             "--trigger-interval", "0.2", "--max-seconds", str(DELIVER_SECONDS)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield job
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)


def finish(job: subprocess.Popen[bytes], log_path: Path) -> str:
    """Wait for the job to end by itself (--until-idle, or --max-seconds); its log, asserting exit 0."""
    try:
        rc = job.wait(DELIVER_SECONDS + 60)
    except subprocess.TimeoutExpired:
        raise AssertionError("deliver did not stop by itself:\n" + log_path.read_text()[-4000:]) from None
    text = log_path.read_text()
    assert rc == 0, text[-4000:]
    return text


def app_dirs(cluster: StandaloneCluster) -> list[set[str]]:
    """Per worker, the applications it ran executors for (its work dir's app-* entries)."""
    return [{p.name for p in (cluster.base_dir / d.role).glob("app-*")} for d in cluster.workers]


def setup_push(warehouse: str, endpoint: str, n: int, ack_deadline: int) -> tuple[SubscriberClient, str, list[str]]:
    pub = PublisherClient(warehouse=warehouse)
    sub = SubscriberClient(warehouse=warehouse, allow_http=True)
    topic = pub.topic_path("local", "orders")
    pub.create_topic(name=topic)
    name = sub.subscription_path("local", "orders-push")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=ack_deadline, push_config={"push_endpoint": endpoint})
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(n)])
    pub.stop()
    return sub, name, ids


def assert_pool_link_is_tls(log: str) -> None:
    # The driver's address is off loopback (Spark picks the machine's interface over a host
    # name that resolves to 127.0.0.1), and any non-local master gets TLS on the pool link.
    assert re.search(r"push pool at https://\S+ \(TLS", log), log[-4000:]
    assert "push pool at http://" not in log


@pytest.mark.parametrize("engine", ENGINES)
def test_deliver_on_the_standalone_cluster(cluster, tmp_path, engine):
    with SlowEndpoint(delay=0.0) as ep:
        # A lease long enough for a slow commit: on a loaded machine a delta-spark micro-batch
        # took 12-25 s here, so a 10 s lease had expired before its push was sent.
        sub, name, ids = setup_push(str(tmp_path / "wh"), ep.url, 200, ack_deadline=60)
        before = app_dirs(cluster)
        log_path = tmp_path / "deliver.log"
        with deliver(cluster, str(tmp_path / "wh"), engine, log_path) as job:
            log = finish(job, log_path)
        pushes = ep.snapshot()
    assert {p.message_id for p in pushes} == set(ids)  # every message pushed
    assert sub.get_backlog(name).num_unacked_messages == 0  # and acked
    summary = re.findall(r"^deliver: nothing left to deliver or retry; delivered (\d+), acked (\d+)", log, re.M)
    assert summary and int(summary[-1][1]) == len(pushes), log[-3000:]
    # The job ran on the cluster: each worker started an executor process for it.
    new = [after - b for after, b in zip(app_dirs(cluster), before)]
    assert all(len(n) == 1 for n in new) and len(set.union(*new)) == 1, new
    assert_pool_link_is_tls(log)
    sub.close()


def endpoint_ports_of(pids: list[int], endpoint_port: int) -> set[int]:
    """Local ports of the TCP connections from `pids` to 127.0.0.1:`endpoint_port`."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.split(":")[1], 16) == endpoint_port:
                ports.add(int(local.split(":")[1], 16))
    return ports


def test_a_worker_killed_mid_run_loses_nothing(cluster, tmp_path):
    """SIGKILL one worker while it has pushes in flight; the run still pushes and acks everything.

    "Kill one worker" means the machine is lost: the worker JVM *and* everything under it
    (its executor JVM and that executor's Python workers, the push worker among them) die
    at once. Killing only the worker JVM would leave its executor running for a while (it
    notices the lost worker and exits on its own), and its pushes would still be answered.
    The pushes the killed executor had open get no outcome; their leases (10 s) expire and
    they are pushed again with a higher delivery attempt; Spark re-runs the lost push
    worker's task on the surviving worker, and the job ends idle with nothing lost.
    Runs last in the module: the cluster keeps one worker after it.
    """
    with SlowEndpoint(delay=2.0) as ep:
        sub, name, ids = setup_push(str(tmp_path / "wh"), ep.url, 300, ack_deadline=10)
        log_path = tmp_path / "deliver.log"
        with deliver(cluster, str(tmp_path / "wh"), "delta-rs", log_path) as job:
            victim, ports = None, set()
            deadline = time.time() + DELIVER_SECONDS
            while victim is None:
                assert job.poll() is None, log_path.read_text()[-4000:]
                assert time.time() < deadline, "no worker had pushes in flight"
                seen = ep.snapshot()
                if len(seen) >= 20:
                    # A worker with a push open now (2 s each), not merely a connection: aiohttp
                    # keeps idle connections open, and a worker whose sockets were all idle was
                    # once chosen and killed with nothing in flight (a fresh-clone CI run).
                    open_from = {p.peer_port for p in seen if p.answered is None}
                    for i, worker in enumerate(cluster.workers):
                        ports = endpoint_ports_of(process_tree(worker.process.pid), ep.port)
                        if ports & open_from:
                            victim = i
                            break
                time.sleep(0.1)
            cluster.kill_worker(victim)
            killed_at = time.time()
            in_flight = {p.message_id: p.attempt for p in ep.snapshot()
                         if p.peer_port in ports and (p.answered is None or p.answered > killed_at)}
            assert in_flight, "the killed worker had no push open"
            log = finish(job, log_path)
        pushes = ep.snapshot()
    assert {p.message_id for p in pushes} == set(ids)  # nothing lost
    assert sub.get_backlog(name).num_unacked_messages == 0  # everything acked
    # What the killed worker had open came back, as a later delivery attempt.
    again = {p.message_id for p in pushes if p.message_id in in_flight and p.attempt > in_flight[p.message_id] and p.arrived > killed_at}
    assert again == set(in_flight), sorted(set(in_flight) - again)[:10]
    assert "nothing left to deliver or retry" in log
    # The driver saw the executor go, and the push workers carried on to the stop: Spark ran
    # the lost worker's task again on the surviving worker (in the runs here the job did not
    # fail; had it, the pool would have started it again), and the job ended normally.
    assert re.search(r"Lost executor \d+ on 127\.0\.0\.1: worker lost", log), log[-4000:]
    assert re.search(r"push workers stopped after \d+ pushes", log), log[-4000:]
    sub.close()
