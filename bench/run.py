"""deltabus benchmarks, side by side with their raw baselines, in one run (not a test).

    ./bench/run.sh [--quick] [--only push,publish,pull,latency,scale] [--out STEM]

A full run writes the results of record, bench/results/<date>.json and .png (<date> in
UTC). A smoke run (--quick) or a partial one (--only with fewer than all sections) never
touches them: it writes bench/results/<date>[-quick][-partial-<sections>].json/.png, which
git ignores. An unknown section is an error and nothing runs or is written. Every
warehouse and job log is made under one scratch directory, removed at the end. Sections:

1. push: a bare aiohttp client posting the same wrapped bodies to the same endpoint (the
   ceiling), then ``jobs/deliver.py`` (through ./spark-submit.sh) delivering N messages,
   acks merged into Delta. Measured from the endpoint's first request to the moment the
   subscription's deliveries partition is empty (every ack merged). "cold" starts with
   Pub/Sub's slow-start window of 3; "warm" is a second run whose window was restored
   from the backlog table, as after any restart of a long-running job.
2. publish: ``publish_batch`` of 1 KB x 1,000 against a bare ``write_deltalake`` append.
3. pull + ack with 1 and 2 processes.
4. latency: publish -> push arrival at a steady rate, p50 / p99.
5. scale: the push job's cost per delivered message with a backlog of 10k, 100k and 1M:
   CPU seconds of the whole job (JVM, driver, Python workers) per ack, and wall time per
   ack; and the time to answer the backlog SQL queries at each size.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results"
SECTIONS = ("push", "publish", "pull", "latency", "scale")  # in the order they run


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


def _deliver(wh: str, *, max_seconds: float | None = None, until_idle: bool = True, trigger: float = 0.2) -> subprocess.Popen:
    args = [str(ROOT / "spark-submit.sh"), "jobs/deliver.py", "--warehouse", wh, "--allow-http", "--trigger-interval", str(trigger)]
    if until_idle:
        args.append("--until-idle")
    if max_seconds is not None:
        args += ["--max-seconds", str(max_seconds)]
    env = {**os.environ, "DELTABUS_SHIP": "0"}
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
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(fields[1])
        cpu = sum(int(x) for x in fields[11:15]) / tick  # utime, stime, cutime, cstime
        stats[int(entry)] = (ppid, cpu)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(c for c, (pp, _) in stats.items() if pp == pid)
    return total


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


def push(n: int, warm_n: int, scratch: Path) -> dict[str, Any]:
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
            proc = _deliver(wh, trigger=0.5)  # conf/deltabus.conf's default trigger
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


# -- 3. pull + ack with 1 and 2 processes ------------------------------------------------------
def _puller(wh: str, name: str, max_messages: int, stop_at: int, counter: Any) -> None:  # child process
    sys.path.insert(0, str(ROOT))
    from deltabus import SubscriberClient

    sub = SubscriberClient(warehouse=wh)
    idle = 0
    while counter.value < stop_at and idle < 20:
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


def pull(n: int, scratch: Path, max_messages: int = 1000) -> dict[str, Any]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {"messages": n, "max_messages": max_messages}
    for procs in (1, 2):
        wh = tempfile.mkdtemp(prefix="pull-", dir=scratch)
        pub, sub = _clients(wh)
        topic = pub.topic_path("bench", "pull")
        name = sub.subscription_path("bench", "pull")
        pub.create_topic(name=topic)
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
        _publish(pub, topic, n)
        counter = ctx.Value("q", 0)
        workers = [ctx.Process(target=_puller, args=(wh, name, max_messages, n, counter)) for _ in range(procs)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join(600)
        elapsed = time.perf_counter() - t0
        out[f"processes_{procs}_msgs_per_s"] = round(counter.value / elapsed, 1)
        out[f"processes_{procs}_acked"] = counter.value
        log(f"pull+ack, {procs} process(es): {counter.value / elapsed:.0f} msg/s")
    return out


# -- 4. latency at a steady rate ---------------------------------------------------------------
def latency(rate: float, seconds: float, warmup: float, scratch: Path) -> dict[str, Any]:
    """Publish -> push arrival at a steady `rate`. The first `warmup` seconds at that rate are
    not counted: they are the push window's slow start from 3 (a long-running job keeps its
    window, and restores it from the backlog table on restart)."""
    from bench.endpoint import BenchEndpoint

    wh = tempfile.mkdtemp(prefix="latency-", dir=scratch)
    pub, sub = _clients(wh)
    topic = pub.topic_path("bench", "latency")
    pub.create_topic(name=topic)
    with BenchEndpoint(track_ids=True) as ep:
        name = sub.subscription_path("bench", "latency")
        sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url})
        proc = _deliver(wh, until_idle=False, max_seconds=seconds + warmup + 90, trigger=0.1)
        # Warm up: wait until the job answers (its first push arrives), as a long-running job would be.
        probe = pub.publish_batch(topic, [{"data": b"warm"}])
        deadline = time.time() + 90
        while time.time() < deadline and not ep.stats()["count"]:
            time.sleep(0.1)
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
        actual_rate = len(published) / seconds  # offered rate over the measured seconds
        deadline = time.time() + 60
        while time.time() < deadline:
            seen = ep.stats()["seen"]
            if all(m in seen for m in published):
                break
            time.sleep(0.5)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        job_out = _job_log(proc, 15)
    missing = [t for m, t in published.items() if m not in seen]
    if missing:
        log(f"latency: {len(missing)} messages not received; published {min(missing) - t_measure:.1f}..{max(missing) - t_measure:.1f} s into the run")
        log("job output tail:\n" + "\n".join(job_out.splitlines()[-15:]))
    del probe
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


# -- 5. scale: cost per message as the backlog grows --------------------------------------------
def scale(sizes: list[int], skip: int, measure: int, sql: Callable[[str], float], scratch: Path) -> dict[str, Any]:
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
            proc = _deliver(wh, until_idle=False, max_seconds=3600, trigger=0.5)

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


# -- chart and main --------------------------------------------------------------------------
def figure(result: dict[str, Any]) -> Any:
    """The results as a matplotlib Figure: one panel per group of sections that ran (a
    partial run gets no empty panels), every axis labelled with its unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = result["results"]
    panels = [name for name, present in (("push", "push" in r), ("publish/pull", "publish" in r or "pull" in r),
                                         ("latency", "latency" in r), ("scale", "scale" in r)) if present]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 4.2), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if "push" in r:
        p = r["push"]
        ax = axes["push"]
        ax.bar(["raw aiohttp\n(mean of 2)", "deliver (warm)", "deliver (cold)"], [p["raw_msgs_per_s"], p["warm_msgs_per_s"], p["cold_msgs_per_s"]], color=["grey", "C0", "C1"])
        ax.axhline(0.5 * p["raw_msgs_per_s"], ls="--", color="red", label="target 0.5x raw")
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
            labels += ["pull+ack x1", "pull+ack x2"]
            values += [r["pull"]["processes_1_msgs_per_s"], r["pull"]["processes_2_msgs_per_s"]]
            colors += ["C2", "C2"]
        ax.bar(labels, values, color=colors)
        ax.tick_params(axis="x", labelrotation=20)
        ax.set_title("publish and pull")
        ax.set_xlabel("client (processes)")
        ax.set_ylabel("messages per second")
    if "latency" in r:
        ax = axes["latency"]
        lat = r["latency"]["samples"]
        share = r["latency"]["received"] / max(1, r["latency"]["messages"])  # the CDF tops out below 1 if some never arrived
        ax.plot(sorted(lat), [share * i / max(1, len(lat) - 1) for i in range(len(lat))])
        ax.set_ylim(0, 1.02)
        ax.axvline(3.0, ls="--", color="red", label="p99 target 3 s")
        ax.set_title(f"publish -> push latency CDF at {r['latency']['actual_rate']:.0f}/s")
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
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        what = f"unknown section {', '.join(map(repr, unknown))}" if unknown else "no section given"
        raise argparse.ArgumentTypeError(f"{what}; valid sections: {', '.join(SECTIONS)}")
    return tuple(s for s in SECTIONS if s in names)


@dataclass(frozen=True, slots=True)
class Options:
    sections: tuple[str, ...]
    quick: bool
    out: Path | None

    @property
    def of_record(self) -> bool:
        """Only a full-size run of every section produces the results of record."""
        return not self.quick and self.sections == SECTIONS


RECORD_NAME = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = _Parser(prog="bench/run.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run, never the results of record)")
    p.add_argument("--only", type=parse_sections, default=SECTIONS, metavar="SECTION[,SECTION...]",
                   help=f"run only these sections (any of {', '.join(SECTIONS)}); a partial run is never the results of record")
    p.add_argument("--out", type=Path, metavar="STEM", help="write STEM.json and STEM.png instead (default: see above)")
    args = p.parse_args(argv)
    opts = Options(sections=args.only, quick=args.quick, out=args.out)
    if opts.out is not None and not opts.of_record and _is_record_path(opts.out):
        p.error(f"--out: a --quick or partial run may not be written over the results of record ({opts.out})")
    return opts


def _is_record_path(stem: Path) -> bool:
    return stem.resolve().parent == RESULTS.resolve() and RECORD_NAME.fullmatch(stem.name) is not None


def result_stem(opts: Options, day: dt.date) -> Path:
    """Where a run's .json and .png go. Smoke and partial runs get their own names (ignored
    by git), so they never overwrite the day's results of record."""
    if opts.out is not None:
        return opts.out
    name = day.isoformat()
    if opts.quick:
        name += "-quick"
    if opts.sections != SECTIONS:
        name += "-partial-" + "+".join(opts.sections)
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
    result: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "quick": q,
        "sections": list(sections),
        "results": {},
    }
    r = result["results"]
    # Warehouses (up to 1M messages for scale) and job logs: one directory, gone at the end.
    with tempfile.TemporaryDirectory(prefix="deltabus-bench-") as tmp:
        scratch = Path(tmp)
        if "push" in sections:
            r["push"] = push(n=5_000 if q else 50_000, warm_n=3_000 if q else 20_000, scratch=scratch)
        if "publish" in sections:
            r["publish"] = publish(batches=10 if q else 50, scratch=scratch)
        if "pull" in sections:
            r["pull"] = pull(n=3_000 if q else 20_000, scratch=scratch)
        if "latency" in sections:
            r["latency"] = latency(rate=500, seconds=10 if q else 60, warmup=10 if q else 20, scratch=scratch)
        if "scale" in sections:
            r["scale"] = scale([1_000, 10_000] if q else [10_000, 100_000, 1_000_000], skip=200 if q else 2_000,
                               measure=600 if q else 6_000, sql=spark_sql_timer(), scratch=scratch)
    result["seconds"] = round(time.time() - started, 1)
    stem = result_stem(opts, now.date())
    write_results(result, stem)
    log(f"wrote {stem}.json and {stem}.png in {result['seconds']:.0f} s" + ("" if opts.of_record else " (not the results of record)"))
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "samples"} for k, v in r.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
