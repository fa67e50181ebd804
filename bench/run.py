"""deltabus benchmarks, side by side with their raw baselines, in one run (not a test).

    ./bench/run.sh [--quick] [--only push,publish,pull,latency,scale,idle,engines,server] [--out STEM]
                   [--engine delta-rs|delta-spark] [--master URL]

A full run writes the results of record, bench/results/<date>.json and .png (<date> in
UTC). A smoke run (--quick) or a partial one (--only with fewer than all sections) never
touches them: it writes bench/results/<date>[-quick][-partial-<sections>].json/.png, which
git ignores. A run on another engine or master than the defaults (delta-rs, the master of
conf/spark-defaults.conf) is a variant: <name>-variant-<engine>[-<master>], ignored too.
An unknown section is an error and nothing runs or is written. Every warehouse and job log
is made under one scratch directory, removed at the end. Sections (1-6 are the default run:
every row of issue 18's table; the targets are the constants below, and bench/table.py
renders the README's table from the results of record):

1. push: a bare aiohttp client posting the same wrapped bodies to the same endpoint (the
   ceiling), then ``jobs/deliver.py`` (through ./spark-submit.sh) delivering N messages,
   acks merged into Delta. Measured from the endpoint's first request to the moment the
   subscription's deliveries partition is empty (every ack merged). "cold" starts with
   Pub/Sub's slow-start window of 3; "warm" is a second run whose window was restored
   from the backlog table, as after any restart of a long-running job.
2. publish: ``publish_batch`` of 1 KB x 1,000 against a bare ``write_deltalake`` append.
3. pull + ack with 1, 2 and 4 processes on one subscription.
4. latency: publish -> push arrival at a steady 500 msg/s, then at 5,000 msg/s, p50 / p99.
5. scale: the push job's cost per delivered message with a backlog of 10k, 100k, 1M and 10M:
   CPU seconds of the whole job (JVM, driver, Python workers) per ack, and wall time per
   ack; and the time to answer the backlog SQL queries at each size.
6. idle: the CPU of a push job with 10 push subscriptions and no messages, as cores.
7. engines (only when asked for: ``--only engines``): push msg/s, publish -> push p50/p99
   and pull msg/s for delta-rs and delta-spark, on the local master and on a standalone
   cluster started on this machine (``deltabus.spark.standalone``), all in one run, printed
   as a Markdown table. Its own results of record: bench/results/<date>-engines.json/.png
   (--quick: <date>-engines-quick, ignored by git).
8. server (only when asked for: ``--only server``; bench/server.py): the same
   google-cloud-pubsub workload against ``deltabus serve`` and Google's Pub/Sub emulator in
   one run (publish, streaming pull + ack with 1 and 4 subscriber processes, publish ->
   callback latency at 500 msg/s), with deltabus / emulator ratios, printed as a Markdown
   table. Its own results of record: bench/results/<date>-server.json/.png (--quick:
   <date>-server-quick, ignored by git).

``--engine`` is the engine of the push job (``jobs/deliver.py --engine``; ./spark-submit.sh
adds the Delta jars for delta-spark) and of the pull section's pullers; publishers stay on
delta-rs (clients beside a cluster job, both engines on one warehouse). ``--master`` goes to
spark-submit.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, NoReturn, Sequence, get_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
# The default run, in the order they run: every row of issue 18's table in one run.
SECTIONS = ("push", "publish", "pull", "latency", "scale", "idle")
# Sections only run when --only names them: "engines" starts a standalone cluster and runs
# every engine on two masters, which does not fit the default run; "server" starts deltabus
# serve and Google's emulator (a JVM) and takes minutes of its own.
EXTRA_SECTIONS = ("engines", "server")
ALL_SECTIONS = SECTIONS + EXTRA_SECTIONS
# Issue 18's targets, each against its baseline in the same run (bench/table.py renders them,
# with the measured figures, into the README's table).
PUSH_WARM_TARGET = 0.8  # x bare aiohttp, window already open
PUSH_COLD_TARGET = 0.6  # x bare aiohttp, 20,000-message backlog, job just started
LATENCY_P50_TARGET_S = {500: 0.1}  # publish -> push, by offered rate
LATENCY_P99_TARGET_S = {500: 0.25, 5000: 1.0}
PULL_SCALING_TARGET = {2: 1.7, 4: 2.5}  # pull + ack by N processes on one subscription, x 1 process
SCALE_COST_TARGET = 1.2  # push job CPU per message, largest backlog vs smallest
PUBLISH_TARGET = 0.9  # publish_batch x bare write_deltalake
IDLE_TARGET_CORES = 0.05  # an idle push job, 10 push subscriptions
BenchEngine = Literal["delta-rs", "delta-spark"]  # the engines a push job or puller runs on
ENGINES: tuple[BenchEngine, ...] = get_args(BenchEngine)
DEFAULT_ENGINE: BenchEngine = "delta-rs"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- helpers ------------------------------------------------------------------------------
def _clients(wh: str):
    from deltabus import PublisherClient, SubscriberClient

    return PublisherClient(warehouse=wh), SubscriberClient(warehouse=wh, allow_http=True)


def _publish(pub, topic: str, n: int, size: int = 1024, per_batch: int = 1000) -> None:
    msgs = [{"data": b"x" * size}] * per_batch
    for start in range(0, n, per_batch):
        pub.publish_batch(topic, msgs[: min(per_batch, n - start)])


class _Watch:
    """Cheap progress checks on a subscription: row counts from the Delta log's file
    statistics (no data read), on one handle brought up to date incrementally."""

    def __init__(self, wh: str, sub_uid: str) -> None:
        from deltalake import DeltaTable

        from deltabus.delivery.cursor import cursor_app_id

        self._dt = DeltaTable(f"{wh}/deliveries")
        self._uid = sub_uid
        self._app = cursor_app_id(sub_uid)

    def refresh(self) -> None:
        self._dt.update_incremental()

    def pending(self) -> int:
        """Rows left in the subscription's deliveries partition (fanned out, not acked), as of the last refresh."""
        import pyarrow as pa
        import pyarrow.compute as pc

        actions = pa.table(self._dt.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return 0
        mine = actions.filter(pc.equal(actions["partition.sub_uid"], self._uid))
        return int(pc.sum(mine["num_records"]).as_py() or 0)

    def cursor(self) -> int | None:
        """The subscription's fan-out cursor, as of the last refresh."""
        return self._dt.transaction_version(self._app)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a push job runs: its storage engine, spark-submit's master (None: the one of
    conf/spark-defaults.conf) and further spark-submit options (a cluster's confs).
    `ship`: whether ./spark-submit.sh ships the library (--py-files), as for a cluster."""

    engine: BenchEngine = DEFAULT_ENGINE
    master: str | None = None
    submit_options: tuple[str, ...] = ()
    ship: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine: must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.master is not None and (not self.master or any(c.isspace() for c in self.master)):
            raise ValueError(f"master: must be a Spark master URL without spaces, got {self.master!r}")


LOCAL = Target()


def _deliver(wh: str, *, max_seconds: float | None = None, until_idle: bool = True, trigger: float = 0.2,
             target: Target = LOCAL) -> subprocess.Popen:
    args = [str(ROOT / "spark-submit.sh")]
    if target.master is not None:
        args += ["--master", target.master]
    args += [*target.submit_options, "jobs/deliver.py", "--warehouse", wh, "--allow-http", "--trigger-interval", str(trigger),
             "--engine", target.engine]
    if until_idle:
        args.append("--until-idle")
    if max_seconds is not None:
        args += ["--max-seconds", str(max_seconds)]
    env = {**os.environ, "DELTABUS_SHIP": "1" if target.ship else "0"}
    # The job's log goes to a file: a pipe nobody reads until the end fills up (64 KiB)
    # and blocks the job mid-run (seen: the stream stopped after ~80 s of batch lines).
    # It sits beside the warehouse, in the run's scratch directory, which is removed at the end.
    log_file = tempfile.NamedTemporaryFile(prefix="deliver-", suffix=".log", dir=Path(wh).parent, delete=False)
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    proc.log_path = log_file.name  # type: ignore[attr-defined]
    log_file.close()
    return proc


def _job_log(proc: subprocess.Popen, lines: int = 40) -> str:
    return "\n".join(Path(proc.log_path).read_text(errors="replace").splitlines()[-lines:])  # type: ignore[attr-defined]


def _wait_drained(wh: str, sub_uid: str, proc: subprocess.Popen, start_version: int, timeout: float) -> float:
    """Seconds since epoch when the subscription's cursor passed start_version and its partition emptied."""
    deadline = time.time() + timeout
    watch = _Watch(wh, sub_uid)
    while time.time() < deadline:
        watch.refresh()  # one log read per poll: the watcher shares the job's two cores
        cur = watch.cursor()
        if cur is not None and cur >= start_version and watch.pending() == 0:
            return time.time()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"not drained (job exit {proc.poll()}):\n{_job_log(proc)}")


def _tree_cpu(root: int) -> float:
    """CPU seconds used so far by process `root` and all its descendants (Spark's JVM, the
    driver, the Python workers), including descendants that already exited and were reaped."""
    from bench import procs

    now = procs.processes()
    return sum(now[pid].cpu_s for pid in procs.tree(now, root))


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    proc.wait(timeout=timeout)
    out = _job_log(proc, 200)
    if proc.returncode != 0:
        raise RuntimeError(f"deliver.py exited {proc.returncode}:\n{out[-4000:]}")
    return out


# -- 1. push against the raw limit ---------------------------------------------------------
def raw_push(url: str, bodies: list[bytes], concurrency: int = 128) -> float:
    """Messages/s of a bare aiohttp client posting `bodies` (no Spark, no Delta)."""
    import aiohttp

    async def run() -> float:
        queue = iter(bodies)
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def worker() -> None:
                for body in queue:
                    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                        await resp.read()
                        if resp.status != 204:
                            raise RuntimeError(resp.status)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return len(bodies) / (time.perf_counter() - t0)

    return asyncio.run(run())


def push(n: int, warm_n: int, scratch: Path, target: Target = LOCAL) -> dict[str, Any]:
    from bench.endpoint import BenchEndpoint
    from deltabus.push.body import wrapped

    wh = tempfile.mkdtemp(prefix="push-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "push")
    pub.create_topic(name=topic)
    out: dict[str, Any] = {"messages": n, "payload_bytes": 1024}
    with BenchEndpoint() as ep:
        now = dt.datetime.now(dt.timezone.utc)
        bodies = [
            wrapped(subscription="projects/bench/subscriptions/push", message_id=str(10**15 + i), data=b"x" * 1024,
                    attributes={}, publish_time=now, ordering_key="", delivery_attempt=1)
            for i in range(n)
        ]
        raw_push(ep.url, bodies[:2000])  # warm up
        # The ceiling is measured before the deliveries and again right after the warm one,
        # and their mean is the baseline: this shared VM's speed drifts by 20-30% between
        # minutes (raw alone ranged 10.7-15.8k msg/s in one afternoon).
        out["raw_before_msgs_per_s"] = round(raw_push(ep.url, bodies), 1)
        log(f"push: raw aiohttp {out['raw_before_msgs_per_s']:.0f} msg/s")
        name = sub.subscription_path("bench", "push")
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url})
        uid = sub._registry.subscription(name).sub_uid
        for label, count in (("cold", warm_n), ("warm", n)):
            ep.reset()
            _publish(pub, topic, count)
            version = pub.engine.version("messages")
            proc = _deliver(wh, trigger=0.5, target=target)  # conf/deltabus.conf's default trigger
            done = _wait_drained(wh, uid, proc, version, timeout=600)
            stats = ep.stats()
            _finish(proc)
            rate = count / (done - stats["first"])
            out[f"{label}_messages"] = count
            out[f"{label}_msgs_per_s"] = round(rate, 1)
            out[f"{label}_requests"] = stats["count"]
            log(f"push ({label}, {count}): {rate:.0f} msg/s, {stats['count']} requests")
        ep.reset()
        out["raw_after_msgs_per_s"] = round(raw_push(ep.url, bodies), 1)
        log(f"push: raw aiohttp again {out['raw_after_msgs_per_s']:.0f} msg/s")
        del bodies
        out["raw_msgs_per_s"] = round((out["raw_before_msgs_per_s"] + out["raw_after_msgs_per_s"]) / 2, 1)
    out["ratio_warm"] = round(out["warm_msgs_per_s"] / out["raw_msgs_per_s"], 3)
    out["ratio_cold"] = round(out["cold_msgs_per_s"] / out["raw_msgs_per_s"], 3)
    out["window_after"] = _window(wh)
    return out


def _window(wh: str) -> int | None:
    from deltabus.storage.arrow import read_table

    rows = read_table(f"{wh}/backlog", ["push_window"])["push_window"].to_pylist()
    return max((r for r in rows if r is not None), default=None)


# -- 2. publish against raw write_deltalake ----------------------------------------------------
def publish(batches: int, scratch: Path) -> dict[str, Any]:
    from bench.foundation import publish_rate

    with tempfile.TemporaryDirectory(prefix="publish-", dir=scratch) as wh:
        r = publish_rate(wh, batches)
    out = {"publish_msgs_per_s": round(r["publish_msgs_per_s"], 1), "raw_write_deltalake_msgs_per_s": round(r["raw_write_deltalake_msgs_per_s"], 1)}
    out["ratio"] = round(out["publish_msgs_per_s"] / out["raw_write_deltalake_msgs_per_s"], 3)
    log(f"publish: {out}")
    return out


# -- 3. pull + ack with 1, 2 and 4 processes ---------------------------------------------------
def delta_jars() -> list[str]:
    """The Delta jars of the delta-spark engine (conf/deltabus.conf's ``[delta-spark] package``),
    fetched once into the checkout's build/delta-jars, exactly as tests/conftest.py does."""
    from deltabus.spark.delta_jars import pinned_jars

    return [str(j) for j in pinned_jars(ROOT / "build" / "delta-jars", sys.executable, os.environ)]


def _puller_client(wh: str, engine: BenchEngine, jars: Sequence[str]) -> Any:
    """A SubscriberClient on `engine`. For delta-spark, this process's own SparkSession
    (local[2], the Delta jars and session settings): a puller is a separate program."""
    from deltabus import SubscriberClient

    if engine == "delta-rs":
        from deltabus.storage import open_engine

        return SubscriberClient(engine=open_engine(wh, engine="delta-rs", create=False))
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local master talks only to itself
    from pyspark.sql import SparkSession

    from deltabus.spark.delta_jars import SESSION_CONFS
    from deltabus.storage import open_engine

    builder = (SparkSession.builder.master("local[2]").appName("bench-puller").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "1")
               .config("spark.sql.session.timeZone", "UTC").config("spark.jars", ",".join(jars)))
    for key, value in SESSION_CONFS.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return SubscriberClient(engine=open_engine(wh, engine="delta-spark", spark=spark, create=False))


def _puller(wh: str, name: str, max_messages: int, stop_at: int, counter: Any, engine: BenchEngine = DEFAULT_ENGINE,
            jars: Sequence[str] = (), ready: Any = None, go: Any = None, max_seconds: float | None = None,
            warm: str | None = None) -> None:  # child process
    sys.path.insert(0, str(ROOT))
    sub = _puller_client(wh, engine, jars)
    if warm is not None:  # one pull + ack on another subscription: a delta-spark first MERGE plans and JITs for tens of seconds
        got = sub.pull(subscription=warm, max_messages=max_messages, return_immediately=True).received_messages
        if got:
            sub.acknowledge(subscription=warm, ack_ids=[m.ack_id for m in got])
    if ready is not None:  # the clock starts once every puller is up (a JVM start takes seconds)
        ready.release()
        go.wait()
    end = math.inf if max_seconds is None else time.monotonic() + max_seconds
    idle = 0
    while counter.value < stop_at and idle < 20 and time.monotonic() < end:
        got = sub.pull(subscription=name, max_messages=max_messages, return_immediately=True).received_messages
        if got:
            sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
            with counter.get_lock():
                counter.value += len(got)
            idle = 0
        else:
            idle += 1
            time.sleep(0.02)
    sub.close()


def pull(n: int, scratch: Path, max_messages: int = 1000, engine: BenchEngine = DEFAULT_ENGINE,
         processes: Sequence[int] = (1, 2, 4), max_seconds: float | None = None) -> dict[str, Any]:
    """Pull + ack of `n` messages by each count of `processes` on `engine`, timed from the
    moment every puller process is up (its client made, for delta-spark its own JVM, and one
    pull + ack done on a second subscription of the topic to warm up) until the last ack, or
    until `max_seconds` (then the rate is of what was acked by then). Publishing is delta-rs,
    as from any client beside the pullers."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {"engine": engine, "messages": n, "max_messages": max_messages, "max_seconds": max_seconds}
    jars = delta_jars() if engine == "delta-spark" else []
    for procs in processes:
        wh = tempfile.mkdtemp(prefix="pull-", dir=scratch)
        pub, sub = _clients(wh)
        topic = pub.topic_path("bench", "pull")
        name = sub.subscription_path("bench", "pull")
        pub.create_topic(name=topic)
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
        warm = sub.subscription_path("bench", "pull-warm")  # before the publish: it gets the messages too
        sub.create_subscription(name=warm, topic=topic, ack_deadline_seconds=600)
        _publish(pub, topic, n)
        counter = ctx.Value("q", 0)
        ready, go = ctx.Semaphore(0), ctx.Event()
        workers = [ctx.Process(target=_puller, args=(wh, name, max_messages, n, counter, engine, jars, ready, go, max_seconds, warm))
                   for _ in range(procs)]
        for w in workers:
            w.start()
        for w in workers:
            if not ready.acquire(timeout=300):
                for x in workers:
                    x.terminate()
                raise RuntimeError(f"pull: a {engine} puller did not start and warm up within 300 s")
        t0 = time.perf_counter()
        go.set()
        end = time.monotonic() + 600
        for w in workers:
            w.join(max(0.0, end - time.monotonic()))
        elapsed = time.perf_counter() - t0
        late = [w for w in workers if w.is_alive()]
        for w in late:  # a puller past the deadline (and, for delta-spark, its JVM) is stopped
            w.terminate()
            w.join(30)
        if late:
            log(f"pull: {len(late)} {engine} puller(s) still running after 600 s were stopped")
        out[f"processes_{procs}_msgs_per_s"] = round(counter.value / elapsed, 1)
        out[f"processes_{procs}_acked"] = counter.value
        log(f"pull+ack, {procs} process(es): {counter.value / elapsed:.0f} msg/s")
    return out


# -- 4. latency at a steady rate ---------------------------------------------------------------
def _steady(pub: Any, topic: str, rate: float, seconds: float, warmup: float) -> tuple[dict[str, float], float, float]:
    """Publish 256-byte messages at a steady `rate` for `warmup` + `seconds` seconds. The
    message ids published after the warm-up, each with the time of its publish call; the
    offered rate over the measured seconds; when the measured part began."""
    published: dict[str, float] = {}
    tick = 0.05
    t_begin = time.time()
    t_measure = t_begin + warmup
    t_end = t_measure + seconds
    sent = 0
    while time.time() < t_end:
        at = time.time()
        # Whatever is due by now: a publish slowed by a busy CPU is caught up at once,
        # so the offered rate stays `rate`. Each message is timed from its publish call.
        due = int((at - t_begin) * rate) - sent
        if due > 0:
            ids = pub.publish_batch(topic, [{"data": b"x" * 256}] * due)
            if at >= t_measure:
                published.update(dict.fromkeys(ids, at))
            sent += due
        time.sleep(max(0.0, tick - (time.time() - at)))
    return published, len(published) / seconds, t_measure


def _await_seen(ep: Any, published: dict[str, float], timeout: float = 60) -> dict[str, float]:
    """The endpoint's first arrival of each message id, once every id in `published` has
    arrived or `timeout` seconds have passed."""
    deadline = time.time() + timeout
    while True:
        seen: dict[str, float] = ep.stats()["seen"]
        if all(m in seen for m in published) or time.time() >= deadline:
            return seen
        time.sleep(0.5)


def _stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM (the job drains and exits 0), SIGKILL after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


LATENCY_TRIGGER = 0.1  # seconds: the latency section's push job trigger


@dataclass(frozen=True, slots=True)
class SteadyRun:
    """One run of the latency workload: each measured message's publish call time and first
    arrival (by id), the offered rate, when measuring began, and the job's whole log."""

    published: dict[str, float]
    seen: dict[str, float]
    actual_rate: float
    t_measure: float
    job_log: str


def steady_run(rate: float, seconds: float, warmup: float, scratch: Path, target: Target = LOCAL) -> SteadyRun:
    """The latency section's workload (also bench/latency_tail.py's): a push job at a 0.1 s
    trigger, warmed up until its first push arrives, then a publisher at a steady `rate` for
    `warmup` + `seconds` seconds, the benchmark's endpoint recording each message's arrival."""
    from bench.endpoint import BenchEndpoint

    wh = tempfile.mkdtemp(prefix="latency-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "latency")
    pub.create_topic(name=topic)
    with BenchEndpoint(track_ids=True) as ep:
        name = sub.subscription_path("bench", "latency")
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url})
        proc = _deliver(wh, until_idle=False, max_seconds=seconds + warmup + 90, trigger=LATENCY_TRIGGER, target=target)
        # Warm up: wait until the job answers (its first push arrives), as a long-running job would be.
        pub.publish_batch(topic, [{"data": b"warm"}])
        deadline = time.time() + 90
        while time.time() < deadline and not ep.stats()["count"]:
            time.sleep(0.1)
        published, actual_rate, t_measure = _steady(pub, topic, rate, seconds, warmup)
        seen = _await_seen(ep, published)
        _stop(proc)
        job_log = Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]
    return SteadyRun(published, seen, actual_rate, t_measure, job_log)


def latency(rate: float, seconds: float, warmup: float, scratch: Path, target: Target = LOCAL) -> dict[str, Any]:
    """Publish -> push arrival at a steady `rate`. The first `warmup` seconds at that rate are
    not counted: they are the push window's slow start from 3 (a long-running job keeps its
    window, and restores it from the backlog table on restart)."""
    r = steady_run(rate, seconds, warmup, scratch, target)
    published, seen, actual_rate, t_measure = r.published, r.seen, r.actual_rate, r.t_measure
    job_out = "\n".join(r.job_log.splitlines()[-15:])
    missing = [t for m, t in published.items() if m not in seen]
    if missing:
        log(f"latency: {len(missing)} messages not received; published {min(missing) - t_measure:.1f}..{max(missing) - t_measure:.1f} s into the run")
        log("job output tail:\n" + "\n".join(job_out.splitlines()[-15:]))
    out = {"target_rate": rate, "actual_rate": round(actual_rate, 1), "seconds": seconds, "warmup_seconds": warmup,
           **latency_stats(published, seen)}
    log(f"latency at {actual_rate:.0f} msg/s: p50 {out['p50_s']} s, p99 {out['p99_s']} s (None: not received), {out['received']}/{out['messages']} received")
    return out


def latency_stats(published: dict[str, float], seen: dict[str, float]) -> dict[str, Any]:
    """Publish -> arrival percentiles over every published message (message id -> time).
    A message never received ranks last, so a percentile that falls on one is None."""
    lat = sorted(seen[m] - t for m, t in published.items() if m in seen)

    def q(p: float) -> float | None:
        i = int(p * len(published))
        return round(lat[i], 3) if i < len(lat) else None

    return {"messages": len(published), "received": len(lat), "p50_s": q(0.5), "p99_s": q(0.99),
            "max_received_s": round(lat[-1], 3) if lat else None, "samples": lat[:: max(1, len(lat) // 500)]}


# -- 6. idle: what a push job costs with nothing to do -----------------------------------------


def idle(subscriptions: int, warmup: float, seconds: float, scratch: Path, target: Target = LOCAL) -> dict[str, Any]:
    """A push job at the default 0.5 s trigger on a warehouse with `subscriptions` push
    subscriptions and no messages: after `warmup` seconds, the CPU seconds of the job's whole
    process tree (spark-submit, JVM, Python workers) over `seconds`, as cores, and the
    micro-batches it ran meanwhile (from its log)."""
    wh = tempfile.mkdtemp(prefix="idle-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "idle")
    pub.create_topic(name=topic)
    for i in range(subscriptions):  # an endpoint nobody serves: nothing is ever pushed to it
        sub.create_subscription(name=sub.subscription_path("bench", f"idle-{i}"), topic=topic,
                                push_config={"push_endpoint": "http://127.0.0.1:9/idle"})
    proc = _deliver(wh, until_idle=False, max_seconds=3600, trigger=0.5, target=target)

    def batches() -> int:
        return sum(1 for line in Path(proc.log_path).read_text(errors="replace").splitlines()  # type: ignore[attr-defined]
                   if "deltabus.deliver: batch " in line)

    try:
        deadline = time.time() + warmup + 120
        while batches() == 0:  # the job is up (its first batch ran)
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the idle job did not start:\n{_job_log(proc)}")
            time.sleep(0.5)
        time.sleep(warmup)
        b0, cpu0, t0 = batches(), _tree_cpu(proc.pid), time.time()
        time.sleep(seconds)
        cpu, wall, ran = _tree_cpu(proc.pid) - cpu0, time.time() - t0, batches() - b0
    finally:
        _stop(proc)
    out = {"subscriptions": subscriptions, "seconds": round(wall, 1), "cpu_s": round(cpu, 2), "cores": round(cpu / wall, 4),
           "batches": ran, "target_cores": IDLE_TARGET_CORES, "target_met": cpu / wall <= IDLE_TARGET_CORES}
    log(f"idle: {out}")
    return out


# -- 5. scale: cost per message as the backlog grows --------------------------------------------
def scale(sizes: list[int], skip: int, measure: int, sql: Callable[[str], float], scratch: Path,
          target: Target = LOCAL) -> dict[str, Any]:
    """Per backlog size: a fresh warehouse, `size` messages published before the job starts,
    then the time per ack between the `skip`-th and the (`skip` + `measure`)-th ack.

    Every size starts from the same cold window, so the figures differ only by what the
    backlog's size costs (fan-out, lease reads and MERGEs, backlog refreshes)."""
    from bench.endpoint import BenchEndpoint

    out: dict[str, Any] = {"skip": skip, "measure": measure, "sizes": {}}
    for size in sizes:
        assert size >= skip + measure, (size, skip, measure)
        wh = tempfile.mkdtemp(prefix=f"scale-{size}-", dir=scratch)
        pub, sub = _clients(wh)
        topic = pub.topic_path("bench", "scale")
        pub.create_topic(name=topic)
        with BenchEndpoint() as ep:
            name = sub.subscription_path("bench", "scale")
            sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url})
            t0 = time.perf_counter()
            _publish(pub, topic, size, size=100)
            publish_s = time.perf_counter() - t0
            proc = _deliver(wh, until_idle=False, max_seconds=3600, trigger=0.5, target=target)

            def wait_for(count: int) -> float:
                while ep.stats()["count"] < count:
                    if proc.poll() is not None:
                        raise RuntimeError(_finish(proc))
                    time.sleep(0.05)
                return time.time()

            t_start = wait_for(skip)
            cpu_start = _tree_cpu(proc.pid)
            t_done = wait_for(skip + measure)
            cpu_used = _tree_cpu(proc.pid) - cpu_start
            proc.terminate()
            proc.wait(timeout=120)
            sub.refresh_backlog()
            backlog_s = sql_times(wh, sql)
        per_msg_ms = cpu_used / measure * 1000
        out["sizes"][str(size)] = {"publish_s": round(publish_s, 2), "cost_ms_per_msg": round(per_msg_ms, 4),
                                   "wall_ms_per_msg": round((t_done - t_start) / measure * 1000, 4),
                                   "msgs_per_s": round(measure / (t_done - t_start), 1), **backlog_s}
        log(f"scale {size}: {per_msg_ms:.3f} CPU ms/msg ({(t_done - t_start) / measure * 1000:.3f} wall ms/msg), sql {backlog_s}")
    first, last = str(sizes[0]), str(sizes[-1])
    out["cost_ratio_largest_vs_smallest"] = round(out["sizes"][last]["cost_ms_per_msg"] / out["sizes"][first]["cost_ms_per_msg"], 3)
    out["wall_ratio_largest_vs_smallest"] = round(out["sizes"][last]["wall_ms_per_msg"] / out["sizes"][first]["wall_ms_per_msg"], 3)
    return out


def sql_times(wh: str, sql: Callable[[str], float]) -> dict[str, float]:
    return {
        "backlog_sql_s": round(sql(f"{wh}|select subscription, num_undelivered_messages, oldest_unacked_message_age from backlog order by 2 desc"), 3),
        "deliveries_sql_s": round(sql(f"{wh}|select subscription, state, count(*) from deliveries group by 1, 2"), 3),
    }


def spark_sql_timer() -> Callable[[str], float]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import deltabus.spark

    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def timed(arg: str) -> float:
        wh, query = arg.split("|", 1)
        deltabus.spark.session(warehouse=wh, spark=spark)
        spark.sql(query).collect()  # plan and warm once, as a user re-running a query would
        t0 = time.perf_counter()
        spark.sql(query).collect()
        return time.perf_counter() - t0

    return timed


# -- 7. engines: delta-rs vs delta-spark, local master vs a standalone cluster ----------------
# The cluster's shape is tests/integration/test_cluster.py's: the push job holds
# delivery_partitions (2) task slots for its push workers and needs one more for micro-batches,
# and it sizes its pool from the cores registered when it starts, so it waits for them all.
CLUSTER_WORKERS, CLUSTER_CORES = 2, 3
CLUSTER_SUBMIT = ("--conf", f"spark.cores.max={CLUSTER_WORKERS * CLUSTER_CORES}",
                  "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0", "--conf", "spark.executor.memory=1g",
                  "--conf", "spark.ui.enabled=false")
ENGINES_TRIGGER = 0.2  # one job serves throughput and latency: between the push (0.5) and latency (0.1) sections'
# The latency phase's publish rate per engine: a rate the engine's push job sustains, or its
# backlog grows for the whole phase and the latency has no bound. delta-spark pushed 124–151
# msg/s in the run of 2026-11-23, so 500 msg/s gave "not received"; it is measured at 50.
ENGINE_LATENCY_RATE: dict[str, float] = {"delta-rs": 500.0, "delta-spark": 50.0}
MasterKind = Literal["local", "standalone"]
MASTER_KINDS: tuple[MasterKind, ...] = get_args(MasterKind)


def partition_confs(slots: int) -> tuple[str, ...]:
    """One partition per task slot for shuffles and Delta's snapshot state (defaults 200 and
    50), as the README's cluster recipe says: on the defaults a delta-spark job's stages ran
    dozens of tasks each on these two cores, and a cluster job was still starting after six
    minutes (tests/integration/test_cluster.py)."""
    return ("--conf", f"spark.sql.shuffle.partitions={slots}", "--conf", f"spark.databricks.delta.snapshotPartitions={slots}")


def local_slots(master: str) -> int | None:
    """The task slots of a ``local[N]`` master (None for another kind, or ``local[*]``)."""
    m = re.fullmatch(r"local\[(\d+)(,\d+)?\]", master)
    return int(m.group(1)) if m else (1 if master == "local" else None)


def default_master(defaults: Path = ROOT / "conf" / "spark-defaults.conf") -> str:
    """The master ./spark-submit.sh uses when given none: the last spark.master of `defaults`."""
    master = ""
    for line in defaults.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "spark.master":
            master = parts[1]
    return master


def push_and_latency(target: Target, n: int, warm_n: int, rate: float, seconds: float, warmup: float,
                     scratch: Path) -> dict[str, Any]:
    """One push job on `target` (until SIGTERM), measured in three phases:

    1. warm-up, not counted: `warm_n` 1 KB messages published before the job starts, until
       drained. It covers the job's start (a cluster's executors) and the window's slow start.
    2. push: `n` 1 KB messages published at once; msg/s from the endpoint's first request of
       the phase until the subscription's partition is empty (every ack merged).
    3. latency: publish -> push arrival at a steady `rate` for `warmup` + `seconds` seconds,
       the first `warmup` not counted.
    Before the job starts, a bare aiohttp client posts to the same endpoint (the ceiling)."""
    from bench.endpoint import BenchEndpoint
    from deltabus.push.body import wrapped

    wh = tempfile.mkdtemp(prefix=f"engines-{target.engine}-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "engines")
    pub.create_topic(name=topic)
    out: dict[str, Any] = {}
    with BenchEndpoint(track_ids=True) as ep:
        now = dt.datetime.now(dt.timezone.utc)
        bodies = [wrapped(subscription="projects/bench/subscriptions/engines", message_id=str(10**15 + i), data=b"x" * 1024,
                          attributes={}, publish_time=now, ordering_key="", delivery_attempt=1) for i in range(5000)]
        raw_push(ep.url, bodies[:1000])  # warm up
        out["raw_msgs_per_s"] = round(raw_push(ep.url, bodies), 1)
        del bodies
        name = sub.subscription_path("bench", "engines")
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url})
        uid = sub._registry.subscription(name).sub_uid
        ep.reset()
        _publish(pub, topic, warm_n)
        t0 = time.time()
        proc = _deliver(wh, until_idle=False, max_seconds=3600, trigger=ENGINES_TRIGGER, target=target)
        try:
            _wait_drained(wh, uid, proc, pub.engine.version("messages"), timeout=360)  # a cluster job's start included
            out["warm_up_s"] = round(time.time() - t0, 1)  # job start included
            ep.reset()
            _publish(pub, topic, n)
            done = _wait_drained(wh, uid, proc, pub.engine.version("messages"), timeout=240)
            stats = ep.stats()
            out["push_msgs_per_s"] = round(n / (done - stats["first"]), 1)
            out["push_requests"] = stats["count"]
            ep.reset()
            published, actual_rate, _ = _steady(pub, topic, rate, seconds, warmup)
            seen = _await_seen(ep, published)
        finally:
            _stop(proc)
    out["job_exit"] = proc.returncode  # 0: it drained and stopped on SIGTERM, as it should
    lat = latency_stats(published, seen)
    lat.pop("samples")
    out["latency"] = {"target_rate": rate, "actual_rate": round(actual_rate, 1), **lat}
    out["window_after"] = _window(wh)
    return out


def engines(push_n: int, warm_n: int, rates: dict[str, float], seconds: float, warmup: float, pull_n: int,
            pull_seconds: float, scratch: Path) -> dict[str, Any]:
    """Every engine on the local master and on a standalone cluster of this machine, in one run.

    Pull needs no master (a client commits from its own process): it is measured once per
    engine, with one process. The cluster is started after the local runs and stopped at the
    end. A combination that fails is recorded with its error; the others still run."""
    from deltabus.spark.standalone import ClusterSettings, StandaloneCluster

    out: dict[str, Any] = {
        "push_messages": push_n, "warm_up_messages": warm_n, "payload_bytes": 1024, "trigger_interval": ENGINES_TRIGGER,
        "latency_rate": rates, "latency_seconds": seconds, "latency_warmup_seconds": warmup, "pull_messages": pull_n,
        "pull_max_seconds": pull_seconds, "local_master": default_master(), "cluster": {"workers": CLUSTER_WORKERS, "cores": CLUSTER_CORES,
                                  "submit": [*CLUSTER_SUBMIT, *partition_confs(CLUSTER_WORKERS * CLUSTER_CORES)]},
        "local_submit": list(partition_confs(local_slots(default_master()) or 4)),
        "pull": {}, "runs": [],
    }
    for engine in ENGINES:
        out["pull"][engine] = pull(pull_n, scratch, engine=engine, processes=(1,), max_seconds=pull_seconds)

    def run(kind: MasterKind, target: Target) -> None:
        row: dict[str, Any] = {"engine": target.engine, "master": kind}
        try:
            row.update(push_and_latency(target, push_n, warm_n, rates[target.engine], seconds, warmup, scratch))
            log(f"engines: {target.engine} on {kind}: push {row['push_msgs_per_s']:.0f} msg/s, "
                f"p50 {row['latency']['p50_s']} s, p99 {row['latency']['p99_s']} s")
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            row["error"] = str(exc)[-2000:]
            log(f"engines: {target.engine} on {kind} failed: {str(exc)[-600:]}")
        out["runs"].append(row)

    local = partition_confs(local_slots(out["local_master"]) or 4)
    for engine in ENGINES:
        run("local", Target(engine, submit_options=local))
    settings = ClusterSettings(workers=CLUSTER_WORKERS, cores=CLUSTER_CORES, memory="1g")
    cluster_dir = Path(tempfile.mkdtemp(prefix="cluster-", dir=scratch))
    with StandaloneCluster(settings, base_dir=cluster_dir, env=os.environ, conf_dir=ROOT / "conf") as cluster:
        log(f"engines: standalone cluster up at {cluster.master_url}")
        for engine in ENGINES:
            run("standalone", Target(engine, cluster.master_url, CLUSTER_SUBMIT + partition_confs(CLUSTER_WORKERS * CLUSTER_CORES), ship=True))
    return out


def _seconds(v: float | None) -> str:
    return "not received" if v is None else f"{v:.2f} s"


def engines_table(e: dict[str, Any]) -> str:
    """The engines section's results as a Markdown table: one row per engine and master."""
    cluster = f"standalone, {e['cluster']['workers']} workers × {e['cluster']['cores']} slots"
    rows = ["| engine | master | push msg/s | publish → push p50 / p99 (at msg/s) | pull + ack msg/s (1 process; no master) |",
            "| --- | --- | --- | --- | --- |"]
    for r in e["runs"]:
        master = f"local (`{e['local_master']}`)" if r["master"] == "local" else cluster
        pulled = e["pull"].get(r["engine"], {})
        rate = pulled.get("processes_1_msgs_per_s")
        pull_cell = "–" if rate is None else f"{rate:,.0f}"
        if rate is not None and pulled.get("processes_1_acked", pulled.get("messages")) != pulled.get("messages"):
            pull_cell += f" ({pulled['processes_1_acked']:,} acked in {pulled['max_seconds']:g} s)"
        if "error" in r:
            first = r["error"].strip().splitlines()[0] if r["error"].strip() else "error"
            rows.append(f"| {r['engine']} | {master} | failed: {first[:80]} | – | {pull_cell} |")
            continue
        lat = r["latency"]
        received = "" if lat["received"] == lat["messages"] else f" ({lat['received']}/{lat['messages']} received)"
        rows.append(f"| {r['engine']} | {master} | {r['push_msgs_per_s']:,.0f} | "
                    f"{_seconds(lat['p50_s'])} / {_seconds(lat['p99_s'])} (at {lat['target_rate']:g}){received} | {pull_cell} |")
    return "\n".join(rows)


# -- chart and main --------------------------------------------------------------------------
def figure(result: dict[str, Any]) -> Any:
    """The results as a matplotlib Figure: one panel per group of sections that ran (a
    partial run gets no empty panels), every axis labelled with its unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    r = result["results"]
    panels = [name for name, present in (("push", "push" in r), ("publish/pull", "publish" in r or "pull" in r),
                                         ("latency", "latency" in r), ("scale", "scale" in r),
                                         ("engines", "engines" in r), ("server", "server" in r),
                                         ("server latency", "server" in r), ("idle", "idle" in r)) if present]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 4.2), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if "idle" in r:
        ax = axes["idle"]
        ax.bar([f"idle push job\n({r['idle']['subscriptions']} subscriptions)"], [r["idle"]["cores"]], color="C0")
        ax.axhline(r["idle"]["target_cores"], ls="--", color="red", label=f"target {r['idle']['target_cores']} cores")
        ax.set_title("idle")
        ax.set_xlabel("job")
        ax.set_ylabel("CPU cores")
        ax.legend()
    if "push" in r:
        p = r["push"]
        ax = axes["push"]
        ax.bar(["raw aiohttp\n(mean of 2)", "deliver (warm)", "deliver (cold)"], [p["raw_msgs_per_s"], p["warm_msgs_per_s"], p["cold_msgs_per_s"]], color=["grey", "C0", "C1"])
        ax.axhline(PUSH_WARM_TARGET * p["raw_msgs_per_s"], ls="--", color="red", label=f"warm target {PUSH_WARM_TARGET}x raw")
        ax.axhline(PUSH_COLD_TARGET * p["raw_msgs_per_s"], ls=":", color="red", label=f"cold target {PUSH_COLD_TARGET}x raw")
        ax.set_title("push")
        ax.set_xlabel("client")
        ax.set_ylabel("messages per second")
        ax.legend()
    if "publish/pull" in axes:
        ax = axes["publish/pull"]
        labels, values, colors = [], [], []
        if "publish" in r:
            labels += ["raw write_deltalake", "publish_batch"]
            values += [r["publish"]["raw_write_deltalake_msgs_per_s"], r["publish"]["publish_msgs_per_s"]]
            colors += ["grey", "C0"]
        if "pull" in r:
            counts = sorted(int(k.split("_")[1]) for k in r["pull"] if k.startswith("processes_") and k.endswith("_msgs_per_s"))
            labels += [f"pull+ack x{n}" for n in counts]
            values += [r["pull"][f"processes_{n}_msgs_per_s"] for n in counts]
            colors += ["C2"] * len(counts)
        ax.bar(labels, values, color=colors)
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_title("publish and pull")
        ax.set_xlabel("client (processes)")
        ax.set_ylabel("messages per second")
    if "latency" in r:
        ax = axes["latency"]
        for i, key in enumerate(k for k in ("latency", "latency_5000") if k in r):
            lat = r[key]["samples"]
            share = r[key]["received"] / max(1, r[key]["messages"])  # the CDF tops out below 1 if some never arrived
            ax.plot(sorted(lat), [share * j / max(1, len(lat) - 1) for j in range(len(lat))], color=f"C{i}",
                    label=f"{r[key]['actual_rate']:.0f} msg/s")
            target = LATENCY_P99_TARGET_S.get(int(r[key]["target_rate"]))
            if target is not None:
                ax.axvline(target, ls="--", color=f"C{i}", label=f"p99 target {target} s")
        ax.set_ylim(0, 1.02)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # (decades only: the minor labels overlapped)
        ax.set_title("publish -> push latency CDF")
        ax.set_xlabel("publish -> push (seconds)")
        ax.set_ylabel("share of messages published")
        ax.legend()
    if "scale" in r:
        ax = axes["scale"]
        sizes = list(r["scale"]["sizes"])
        xs = [int(s) for s in sizes]
        ax.plot(xs, [r["scale"]["sizes"][s]["cost_ms_per_msg"] for s in sizes], marker="o", color="C0", label="push job CPU ms per msg")
        ax.plot(xs, [r["scale"]["sizes"][s]["wall_ms_per_msg"] for s in sizes], marker="o", ls=":", color="C0", label="wall ms per msg")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("ms per message", color="C0")
        ax2 = ax.twinx()
        ax2.plot(xs, [r["scale"]["sizes"][s]["backlog_sql_s"] for s in sizes], marker="s", color="C1", label="backlog SQL")
        ax2.plot(xs, [r["scale"]["sizes"][s]["deliveries_sql_s"] for s in sizes], marker="^", color="C2", label="deliveries by state SQL")
        ax2.set_ylim(bottom=0)
        ax2.set_ylabel("query seconds")
        ax.set_xscale("log")
        ax.set_title("cost as the backlog grows")
        ax.set_xlabel("backlog (messages)")
        ax.legend(loc="lower left", fontsize=8)
        ax2.legend(loc="lower right", fontsize=8)
    if "engines" in r:
        ax = axes["engines"]
        runs = [x for x in r["engines"]["runs"] if "error" not in x]
        ax.bar([f"{x['engine']}\n{x['master']}" for x in runs], [x["push_msgs_per_s"] for x in runs],
               color=["C0" if x["engine"] == "delta-rs" else "C3" for x in runs])
        ax.set_title("push by engine and master")
        ax.set_xlabel("engine, master")
        ax.set_ylabel("messages per second")
    if "server" in r:
        from bench import server

        server.draw(axes["server"], axes["server latency"], r["server"])
    fig.tight_layout()
    return fig


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(result)
    fig.savefig(path, dpi=90, format="png")  # the path may end in .tmp (see write_results)
    plt.close(fig)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line naming the flag and the rule (argparse's default adds the whole usage)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_sections(raw: str) -> tuple[str, ...]:
    """``--only``'s comma-separated list, in running order; unknown or no sections are an error."""
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_SECTIONS]
    if unknown or not names:
        what = f"unknown section {', '.join(map(repr, unknown))}" if unknown else "no section given"
        raise argparse.ArgumentTypeError(f"{what}; valid sections: {', '.join(ALL_SECTIONS)}")
    return tuple(s for s in ALL_SECTIONS if s in names)


ENGINES_ONLY = ("engines",)
SERVER_ONLY = ("server",)
RecordKind = Literal["full", "engines", "server"]


@dataclass(frozen=True, slots=True)
class Options:
    """A run's choices. `engine` and `master` (None: conf/spark-defaults.conf's) are where the
    push job and the pullers run; the engines section chooses its own and takes neither."""

    sections: tuple[str, ...]
    quick: bool
    out: Path | None
    engine: BenchEngine = DEFAULT_ENGINE
    master: str | None = None

    def __post_init__(self) -> None:
        if not self.sections or any(s not in ALL_SECTIONS for s in self.sections):
            raise ValueError(f"sections: must be some of {', '.join(ALL_SECTIONS)}, got {self.sections!r}")
        Target(self.engine, self.master)  # the same rules as a job's target

    @property
    def variant(self) -> bool:
        """Another engine or master than the defaults: never the results of record."""
        return self.engine != DEFAULT_ENGINE or self.master is not None

    @property
    def record_kind(self) -> RecordKind | None:
        """Which results of record this run produces: a full-size default run of every section
        ("full"), a full-size run of the engines or the server section alone ("engines",
        "server"), else none."""
        if self.quick or self.variant:
            return None
        if self.sections == SECTIONS:
            return "full"
        return {ENGINES_ONLY: "engines", SERVER_ONLY: "server"}.get(self.sections)  # type: ignore[return-value]

    @property
    def of_record(self) -> bool:
        """Only a full-size run of every section, or of the engines or server section alone, on the
        default engine and master produces results of record."""
        return self.record_kind is not None


RECORD_NAME = re.compile(r"\d{4}-\d{2}-\d{2}")
ENGINES_RECORD_NAME = re.compile(r"\d{4}-\d{2}-\d{2}-engines")
SERVER_RECORD_NAME = re.compile(r"\d{4}-\d{2}-\d{2}-server")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = _Parser(prog="bench/run.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, never the results of record)")
    p.add_argument("--only", type=parse_sections, default=SECTIONS, metavar="SECTION[,SECTION...]",
                   help=f"run only these sections (any of {', '.join(ALL_SECTIONS)}; engines only when named); "
                        "a partial run is never the results of record")
    p.add_argument("--out", type=Path, metavar="STEM", help="write STEM.json and STEM.png instead (default: see above)")
    p.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                   help=f"engine of the push job and the pullers (default {DEFAULT_ENGINE}); another one is a variant run")
    p.add_argument("--master", metavar="URL",
                   help="spark-submit's master for the push job (default: conf/spark-defaults.conf's); given, the run is a variant")
    args = p.parse_args(argv)
    if "engines" in args.only and (args.engine != DEFAULT_ENGINE or args.master is not None):
        p.error(f"--{'engine' if args.engine != DEFAULT_ENGINE else 'master'}: the engines section runs every engine "
                "on the local master and on a standalone cluster; run it without --engine and --master")
    if "server" in args.only and (args.engine != DEFAULT_ENGINE or args.master is not None):
        p.error(f"--{'engine' if args.engine != DEFAULT_ENGINE else 'master'}: the server section measures deltabus serve "
                "(delta-rs, no Spark) against the emulator; run it without --engine and --master")
    if args.master is not None and (not args.master.strip() or any(c.isspace() for c in args.master)):
        p.error(f"--master: must be a Spark master URL without spaces, got {args.master!r}")
    opts = Options(sections=args.only, quick=args.quick, out=args.out, engine=args.engine, master=args.master)
    if opts.out is not None and _record_kind_of(opts.out) not in (None, opts.record_kind):
        p.error(f"--out: a --quick, partial or variant run may not be written over the results of record ({opts.out})")
    return opts


def _record_kind_of(stem: Path) -> RecordKind | None:
    """Which results of record `stem` names, if any."""
    if stem.resolve().parent != RESULTS.resolve():
        return None
    if RECORD_NAME.fullmatch(stem.name):
        return "full"
    if ENGINES_RECORD_NAME.fullmatch(stem.name):
        return "engines"
    return "server" if SERVER_RECORD_NAME.fullmatch(stem.name) else None


def _is_record_path(stem: Path) -> bool:
    return _record_kind_of(stem) is not None


def _tag(text: str) -> str:
    """`text` as a file-name part: runs of anything but letters and digits become one '-'."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def result_stem(opts: Options, day: dt.date) -> Path:
    """Where a run's .json and .png go. Smoke and partial runs get their own names (ignored
    by git), so they never overwrite the day's results of record."""
    if opts.out is not None:
        return opts.out
    name = day.isoformat()
    if opts.sections in (ENGINES_ONLY, SERVER_ONLY):  # their own results of record; the quick ones match *-quick.*
        return RESULTS / (name + "-" + opts.sections[0] + ("-quick" if opts.quick else ""))
    if opts.quick:
        name += "-quick"
    if opts.sections != SECTIONS:
        name += "-partial-" + "+".join(opts.sections)
    if opts.variant:
        name += "-variant-" + opts.engine + (f"-{_tag(opts.master)}" if opts.master is not None else "")
    return RESULTS / name


def write_results(result: dict[str, Any], stem: Path) -> None:
    """Both files or neither: each is written aside and renamed into place once both exist."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_tmp, png_tmp = Path(f"{stem}.json.tmp"), Path(f"{stem}.png.tmp")
    try:
        json_tmp.write_text(json.dumps(result, indent=2) + "\n")
        chart(result, png_tmp)
        os.replace(json_tmp, f"{stem}.json")
        os.replace(png_tmp, f"{stem}.png")
    finally:
        json_tmp.unlink(missing_ok=True)
        png_tmp.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)  # before anything runs: a bad flag costs nothing and writes nothing
    sections, q = opts.sections, opts.quick
    started = time.time()
    now = dt.datetime.now(dt.timezone.utc)
    slots = local_slots(opts.master or default_master())
    target = Target(opts.engine, opts.master, partition_confs(slots) if opts.engine == "delta-spark" and slots else ())
    result: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "quick": q,
        "sections": list(sections),
        "engine": opts.engine,
        "master": opts.master or default_master(),
        "results": {},
    }
    r = result["results"]
    # Warehouses (up to 10M messages for scale) and job logs: one directory, gone at the end.
    with tempfile.TemporaryDirectory(prefix="deltabus-bench-") as tmp:
        scratch = Path(tmp)
        if "push" in sections:
            r["push"] = push(n=5_000 if q else 50_000, warm_n=3_000 if q else 20_000, scratch=scratch, target=target)
        if "publish" in sections:
            r["publish"] = publish(batches=10 if q else 50, scratch=scratch)
        if "pull" in sections:
            r["pull"] = pull(n=3_000 if q else 20_000, scratch=scratch, engine=opts.engine)
        if "latency" in sections:
            r["latency"] = latency(rate=500, seconds=5 if q else 60, warmup=5 if q else 20, scratch=scratch, target=target)
            # Ten times the rate (issue 18: p99 under 1 s); its warm-up lets the window open that far.
            r["latency_5000"] = latency(rate=5000, seconds=3 if q else 30, warmup=3 if q else 20, scratch=scratch, target=target)
        if "scale" in sections:
            r["scale"] = scale([1_000, 10_000] if q else [10_000, 100_000, 1_000_000, 10_000_000], skip=100 if q else 2_000,
                               measure=400 if q else 6_000, sql=spark_sql_timer(), scratch=scratch, target=target)
        if "idle" in sections:
            r["idle"] = idle(subscriptions=10, warmup=3 if q else 20, seconds=6 if q else 30, scratch=scratch, target=target)
        if "engines" in sections:
            # Smaller than the push and latency sections: 4 jobs (2 on a cluster) in ~10 minutes on 2 cores.
            r["engines"] = engines(push_n=2_000 if q else 10_000, warm_n=1_000 if q else 3_000, rates=ENGINE_LATENCY_RATE,
                                   seconds=5 if q else 20, warmup=5 if q else 10, pull_n=2_000 if q else 10_000,
                                   pull_seconds=20 if q else 45, scratch=scratch)
        if "server" in sections:
            from bench import server

            r["server"] = server.run(server.QUICK if q else server.FULL, scratch)
    result["seconds"] = round(time.time() - started, 1)
    stem = result_stem(opts, now.date())
    write_results(result, stem)
    log(f"wrote {stem}.json and {stem}.png in {result['seconds']:.0f} s" + ("" if opts.of_record else " (not the results of record)"))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk not in ("samples", "servers")} for k, v in r.items()}, indent=2))
    if "engines" in r:
        print(engines_table(r["engines"]))
    if "server" in r:
        from bench import server

        print(server.table(r["server"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
