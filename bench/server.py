"""`deltabus serve` against Google's Pub/Sub emulator: the same official-client workload, in one run (not a test).

    ./bench/run.sh --only server [--quick]

It is bench/run.py's ``server`` section (run only when named, like ``engines``). A full run
writes its own results of record, bench/results/<date>-server.json/.png; --quick writes
<date>-server-quick, which git ignores.

Both servers run side by side for the whole run, each a subprocess on a free 127.0.0.1
port: ``deltabus serve`` (``python -m deltabus.cli serve --port 0``, its ready line names the
port) on a fresh warehouse in the run's scratch directory, and the emulator
(``cloud-pubsub-emulator --host=127.0.0.1 --port=P``, ready when the port accepts). Every
client is the unchanged google-cloud-pubsub library pointed at a server by
``PUBSUB_EMULATOR_HOST``, with its default settings (publisher batching of 100 messages /
1 MB / 10 ms; subscriber FlowControl of 1,000 messages). Each phase runs on one server and
then on the other before the next phase starts, so the VM's drift between minutes (20-30%
here) hits both alike. Payloads are PAYLOAD_BYTES bytes.

0. warm-up, not counted: a short publish and subscribe() on a topic of its own (the JVM's
   JIT, deltabus's first MERGE).
1. publish: ``PublisherClient.publish`` of N messages in a loop, from the first call until
   every future resolved; msg/s.
2. pull + ack: N messages pre-published to a topic with two subscriptions, then
   ``subscribe()`` with a callback that acks, by 1 client on the first subscription and by
   CLIENTS on the second. Every client is a process of its own (spawned and connected
   before the clock; the client's callbacks and lease management hold its GIL). msg/s from
   the first callback of any client until the last ack confirmed: an ack counts as
   confirmed when the unary Acknowledge call carrying it (the client sends acks so) returned
   OK, seen by wrapping the client object's ``acknowledge`` method (observation only; the
   library's code runs unchanged). deltabus answers an Acknowledge once its MERGE
   committed; for deltabus the run also checks the subscription's deliveries partition is
   empty afterwards (every ack on the table).
3. latency: publish -> callback at a steady RATE msg/s (the bench process publishes, one
   ``publish`` call per message, each timed at its call) for WARMUP + SECONDS seconds, the
   first WARMUP not counted; p50 / p99 over the messages published after the warm-up (a
   message never received ranks last), with 1 and with CLIENTS subscriber processes.

For deltabus it also records where the time goes, from outside the server: the server
process's CPU seconds per phase and, from the Delta logs, the commits of each table in the
phase (count, commits/s, rows and MERGE execution time per commit). The emulator's CPU
(its JVM) is recorded too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, get_args

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
ServerKind = Literal["deltabus", "emulator"]
SERVER_KINDS: tuple[ServerKind, ...] = get_args(ServerKind)
PROJECT = "bench"
PAYLOAD_BYTES = 512
START_TIMEOUT = 90.0  # seconds for a server to come up (a JVM on a busy 2-core machine)
TARGETS = {"publish_ratio": 1.0, "pull_ratio": 1.0, "p99_s": 0.100}  # issue 14


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True, slots=True)
class Sizes:
    """A run's sizes: messages published, pre-published for pull + ack, the latency phase's
    rate and seconds (after `warmup` seconds not counted), the concurrent clients, the
    warm-up's messages and how long a phase may take before it is cut (its figures then
    cover what was done, and say so)."""

    publish: int
    pull: int
    rate: float
    seconds: float
    warmup: float
    clients: int
    warm: int
    phase_timeout: float

    def __post_init__(self) -> None:
        for name in ("publish", "pull", "clients", "warm"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        for name in ("rate", "seconds", "warmup", "phase_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or (name != "warmup" and value == 0):
                raise ValueError(f"{name}: must be a positive number of {'msg/s' if name == 'rate' else 'seconds'}, got {value!r}")


FULL = Sizes(publish=50_000, pull=20_000, rate=500.0, seconds=30.0, warmup=10.0, clients=4, warm=2_000, phase_timeout=240.0)
QUICK = Sizes(publish=2_000, pull=1_000, rate=500.0, seconds=3.0, warmup=2.0, clients=4, warm=200, phase_timeout=60.0)


# -- the servers ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server subprocess on 127.0.0.1: `host` is its PUBSUB_EMULATOR_HOST. Its output goes
    to a log file in the scratch directory (a pipe nobody reads would fill and block it)."""

    kind: ServerKind
    host: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    started_s: float
    warehouse: str | None = None

    def cpu(self) -> float:
        return proc_cpu(self.proc.pid)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM (both stop cleanly on it), SIGKILL after `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


class DeltabusServer(Server):
    kind: ServerKind = "deltabus"

    def __init__(self, scratch: Path) -> None:
        self.warehouse = tempfile.mkdtemp(prefix="serve-", dir=scratch)
        self.log_path = scratch / "deltabus-serve.log"
        t0 = time.monotonic()
        with open(self.log_path, "wb") as err:
            # Port 0: the server binds a free port and names it in its one ready line.
            self.proc = subprocess.Popen([sys.executable, "-m", "deltabus.cli", "serve", "--warehouse", self.warehouse, "--port", "0"],
                                         cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
        assert self.proc.stdout is not None
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(START_TIMEOUT)
        found = re.search(rb" on 127\.0\.0\.1:(\d+),", line[0]) if line else None
        if found is None:
            self.stop()
            raise RuntimeError(f"deltabus serve did not come up in {START_TIMEOUT:.0f} s: {line!r}\n{self.log_tail()}")
        self.host = f"127.0.0.1:{int(found.group(1))}"
        self.started_s = round(time.monotonic() - t0, 2)
        # Anything it prints later is drained, so the pipe never fills.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]


class EmulatorServer(Server):
    kind: ServerKind = "emulator"

    def __init__(self, scratch: Path, binary: Path = EMULATOR) -> None:
        port = free_port()
        self.host = f"127.0.0.1:{port}"
        self.log_path = scratch / "emulator.log"
        t0 = time.monotonic()
        with open(self.log_path, "wb") as out:
            # The launcher execs java, so this pid is the JVM's (its CPU is the emulator's).
            self.proc = subprocess.Popen([str(binary), "--host=127.0.0.1", f"--port={port}"], cwd=scratch,
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the emulator exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the emulator's port did not accept in {START_TIMEOUT:.0f} s:\n{self.log_tail()}")
                time.sleep(0.1)
        self.started_s = round(time.monotonic() - t0, 2)


# -- the official clients ------------------------------------------------------------------------
@contextlib.contextmanager
def pointed_at(host: str) -> Iterator[None]:
    """PUBSUB_EMULATOR_HOST=host while clients are made (the clients read it when made)."""
    before = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
        else:
            os.environ["PUBSUB_EMULATOR_HOST"] = before


def publisher(host: str) -> Any:
    from google.cloud import pubsub_v1

    with pointed_at(host):
        return pubsub_v1.PublisherClient()


def subscriber(host: str) -> Any:
    from google.cloud import pubsub_v1

    with pointed_at(host):
        return pubsub_v1.SubscriberClient()


def topic_path(name: str) -> str:
    return f"projects/{PROJECT}/topics/{name}"


def subscription_path(name: str) -> str:
    return f"projects/{PROJECT}/subscriptions/{name}"


def publish_all(pub: Any, topic: str, n: int, data: bytes, timeout: float) -> float:
    """Publish `n` messages one call each (the client batches them); seconds from the first
    call until every future resolved."""
    t0 = time.perf_counter()
    futures = [pub.publish(topic, data) for _ in range(n)]
    deadline = time.monotonic() + timeout
    for f in futures:
        f.result(timeout=max(1.0, deadline - time.monotonic()))
    return time.perf_counter() - t0


class Consumer:
    """One subscriber client's side of a phase: its subscribe() callback records what
    arrived (message ids, or for latency the sequence attribute ``i`` with the callback's
    time) and acks; the client object's ``acknowledge`` is wrapped to count the ack ids of
    every unary Acknowledge that returned OK (`confirmed`, a shared counter) and when the
    last did. `received` counts callbacks (shared across processes)."""

    def __init__(self, client: Any, latency: bool, received: Any, confirmed: Any) -> None:
        self.latency = latency
        self.received = received
        self.confirmed = confirmed
        self.seen: list[Any] = []
        self.first: float | None = None
        self.last_confirm: float | None = None
        self.acks_confirmed = 0
        self.ack_calls = 0
        self._lock = threading.Lock()
        original = client.acknowledge

        def acknowledge(*args: Any, **kwargs: Any) -> Any:
            answer = original(*args, **kwargs)
            request = kwargs.get("request", args[0] if args else None)
            ids = kwargs.get("ack_ids") or (request.ack_ids if request is not None and not isinstance(request, dict)
                                             else (request or {}).get("ack_ids", []))
            now = time.time()
            with self._lock:
                self.acks_confirmed += len(ids)
                self.ack_calls += 1
                self.last_confirm = now
            with self.confirmed.get_lock():
                self.confirmed.value += len(ids)
            return answer

        client.acknowledge = acknowledge  # the streaming pull manager sends its acks through it

    def callback(self, message: Any) -> None:
        now = time.time()
        item = (int(message.attributes["i"]), now) if self.latency else message.message_id
        with self._lock:
            self.seen.append(item)
            if self.first is None or now < self.first:
                self.first = now
        message.ack()
        with self.received.get_lock():
            self.received.value += 1

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"first": self.first, "last_confirm": self.last_confirm, "acks_confirmed": self.acks_confirmed,
                    "ack_calls": self.ack_calls, "seen": list(self.seen)}


def stop_future(future: Any) -> None:
    future.cancel()
    with contextlib.suppress(Exception):
        future.result(timeout=30)


def _subscriber_process(host: str, subscription: str, latency: bool, received: Any, confirmed: Any, ready: Any,
                        go: Any, stop: Any, out: Any) -> None:  # pragma: no cover - child process
    client = subscriber(host)
    consumer = Consumer(client, latency, received, confirmed)
    ready.release()
    go.wait()
    future = client.subscribe(subscription, consumer.callback)
    stop.wait()
    stop_future(future)
    client.close()
    out.put(consumer.report())


class Subscribers:
    """`count` subscriber processes on one subscription, each its own SubscriberClient,
    made before the clock; ``go`` opens every stream at once."""

    def __init__(self, host: str, subscription: str, count: int, latency: bool) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.received = ctx.Value("q", 0)
        self.confirmed = ctx.Value("q", 0)
        self._ready, self._go, self._stop, self._out = ctx.Semaphore(0), ctx.Event(), ctx.Event(), ctx.Queue()
        self.procs = [ctx.Process(target=_subscriber_process, daemon=True,
                                  args=(host, subscription, latency, self.received, self.confirmed, self._ready, self._go,
                                        self._stop, self._out)) for _ in range(count)]
        for p in self.procs:
            p.start()
        for _ in self.procs:
            if not self._ready.acquire(timeout=120):
                self.kill()
                raise RuntimeError("a subscriber process did not start within 120 s")

    def go(self) -> None:
        self._go.set()

    def wait(self, counter: Any, n: int, timeout: float) -> bool:
        """True once `counter` reached n; False after `timeout` seconds or if a process died."""
        deadline = time.monotonic() + timeout
        while counter.value < n:
            if time.monotonic() > deadline or any(not p.is_alive() for p in self.procs):
                return False
            time.sleep(0.02)
        return True

    def finish(self) -> list[dict[str, Any]]:
        self._stop.set()
        reports = []
        for p in self.procs:
            try:
                reports.append(self._out.get(timeout=60))
            except Exception:
                break
        for p in self.procs:
            p.join(10)
        self.kill()
        return reports

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(5)


# -- deltabus's side, from outside: the Delta logs ------------------------------------------------
def log_version(warehouse: str, table: str) -> int:
    names = [p.name for p in (Path(warehouse) / table / "_delta_log").glob("*.json")]
    return max((int(n.split(".")[0]) for n in names), default=-1)


def log_versions(warehouse: str) -> dict[str, int]:
    return {t: log_version(warehouse, t) for t in ("messages", "deliveries")}


def commit_profile(warehouse: str, table: str, after: int, upto: int) -> dict[str, Any]:
    """The commits of `table` in versions (after, upto]: per operation their count, and for
    MERGEs the rows touched and the execution time per commit (from delta-rs's
    operationMetrics), the files added, and commits per second over their time span."""
    ops: dict[str, dict[str, Any]] = {}
    stamps: list[int] = []
    for version in range(after + 1, upto + 1):
        path = Path(warehouse) / table / "_delta_log" / f"{version:020d}.json"
        info: dict[str, Any] = {}
        adds = 0
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
            elif "add" in action:
                adds += 1
        op = ops.setdefault(str(info.get("operation", "?")), {"commits": 0, "files_added": 0, "rows": [], "exec_ms": []})
        op["commits"] += 1
        op["files_added"] += adds
        metrics = info.get("operationMetrics") or {}
        rows = sum(int(metrics.get(k, 0) or 0) for k in ("num_target_rows_inserted", "num_target_rows_updated",
                                                         "num_target_rows_deleted", "num_added_rows"))
        op["rows"].append(rows)
        if "execution_time_ms" in metrics:
            op["exec_ms"].append(float(metrics["execution_time_ms"]))
        if "timestamp" in info:
            stamps.append(int(info["timestamp"]))
    out: dict[str, Any] = {"commits": upto - after}
    if len(stamps) > 1 and stamps[-1] > stamps[0]:
        out["commits_per_s"] = round((len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1000), 1)
    for name, op in ops.items():
        row: dict[str, Any] = {"commits": op["commits"], "files_added": op["files_added"]}
        if any(op["rows"]):
            row["rows_per_commit_mean"] = round(statistics.fmean(op["rows"]), 1)
            row["rows_per_commit_max"] = max(op["rows"])
        if op["exec_ms"]:
            ex = sorted(op["exec_ms"])
            row["exec_ms_p50"] = round(ex[len(ex) // 2], 1)
            row["exec_ms_p90"] = round(ex[int(len(ex) * 0.9)], 1)
            row["exec_ms_total"] = round(sum(ex), 1)
        out[name] = row
    return out


# Seconds the pull phase waits after the clients' last confirmed ack for every ack to be on the table.
ACKS_ON_TABLE_TIMEOUT = 10.0


def deliveries_left(warehouse: str, subscription: str) -> int:
    """Rows left in the subscription's deliveries partition (0: every ack on the table), from
    the log's file statistics; -1 if the subscription's cursor has not passed the topic's
    last publish (some messages were never fanned out, so 0 rows proves nothing)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    from deltabus.delivery.cursor import cursor_app_id
    from deltabus.registry import Registry
    from deltabus.storage import open_engine

    engine = open_engine(warehouse, engine="delta-rs", create=False)
    uid = Registry(engine, clock=time.time).subscription(subscription).sub_uid
    table = DeltaTable(f"{warehouse}/deliveries")
    cursor = table.transaction_version(cursor_app_id(uid))
    if cursor is None or cursor < DeltaTable(f"{warehouse}/messages").version():
        return -1
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    mine = actions.filter(pc.equal(actions["partition.sub_uid"], uid))
    return int(pc.sum(mine["num_records"]).as_py() or 0)


# -- the phases ---------------------------------------------------------------------------------
class Phase:
    """Measures one phase on one server: its CPU seconds and, for deltabus, the commits of
    the phase (the log versions before and after)."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def __enter__(self) -> "Phase":
        self.cpu0 = self.server.cpu()
        self.t0 = time.monotonic()
        self.v0 = log_versions(self.server.warehouse) if self.server.warehouse else None
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.t0
        self.cpu_s = self.server.cpu() - self.cpu0

    def record(self, out: dict[str, Any], messages: int) -> None:
        out["server_cpu_s"] = round(self.cpu_s, 2)
        out["server_cpu_ms_per_msg"] = round(self.cpu_s / max(1, messages) * 1000, 3)
        out["phase_wall_s"] = round(self.seconds, 2)
        if self.v0 is not None and self.server.warehouse:
            v1 = log_versions(self.server.warehouse)
            out["commits"] = {t: commit_profile(self.server.warehouse, t, self.v0[t], v1[t]) for t in v1}


def warm_up(server: Server, sizes: Sizes) -> None:
    """Not counted: a publish and a subscribe() until every message is acked (the JVM's JIT,
    deltabus's first commits and MERGE, the client's channel)."""
    topic, sub = topic_path("warm"), subscription_path("warm")
    pub, subc = publisher(server.host), subscriber(server.host)
    pub.create_topic(name=topic)
    subc.create_subscription(name=sub, topic=topic)
    publish_all(pub, topic, sizes.warm, b"w" * PAYLOAD_BYTES, timeout=sizes.phase_timeout)
    import multiprocessing

    received, confirmed = multiprocessing.Value("q", 0), multiprocessing.Value("q", 0)
    consumer = Consumer(subc, False, received, confirmed)
    future = subc.subscribe(sub, consumer.callback)
    deadline = time.monotonic() + sizes.phase_timeout
    while confirmed.value < sizes.warm and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_future(future)
    subc.close()
    pub.stop()
    if confirmed.value < sizes.warm:
        raise RuntimeError(f"{server.kind}: warm-up acked {confirmed.value} of {sizes.warm} in {sizes.phase_timeout:.0f} s")


def publish_phase(server: Server, sizes: Sizes) -> dict[str, Any]:
    topic = topic_path("publish")
    pub = publisher(server.host)
    pub.create_topic(name=topic)
    with Phase(server) as phase:
        seconds = publish_all(pub, topic, sizes.publish, b"p" * PAYLOAD_BYTES, timeout=sizes.phase_timeout)
    pub.stop()
    out: dict[str, Any] = {"messages": sizes.publish, "seconds": round(seconds, 3), "msgs_per_s": round(sizes.publish / seconds, 1)}
    phase.record(out, sizes.publish)
    log(f"server: {server.kind} publish {out['msgs_per_s']:,.0f} msg/s ({sizes.publish:,} x {PAYLOAD_BYTES} B)")
    return out


PULL_COUNTS = ("1", "many")  # the pull phase's subscriptions: one client, CLIENTS clients


def prepare_pull(server: Server, sizes: Sizes) -> None:
    """The pull topic with one subscription per client count, and N messages on both."""
    topic = topic_path("pull")
    pub, subc = publisher(server.host), subscriber(server.host)
    pub.create_topic(name=topic)
    for count in PULL_COUNTS:
        subc.create_subscription(name=subscription_path(f"pull-{count}"), topic=topic)
    subc.close()
    publish_all(pub, topic, sizes.pull, b"s" * PAYLOAD_BYTES, timeout=sizes.phase_timeout)
    pub.stop()


def pull_phase(server: Server, sizes: Sizes, clients: int) -> dict[str, Any]:
    n = sizes.pull
    name = subscription_path(f"pull-{'1' if clients == 1 else 'many'}")
    subs = Subscribers(server.host, name, clients, latency=False)
    with Phase(server) as phase:
        subs.go()
        done = subs.wait(subs.confirmed, n, sizes.phase_timeout)
        reports = subs.finish()
        # deltabus answers an Acknowledge once its server's journal holds it and commits it
        # to the table within ``defer_seconds``: the rate with that wait counted too, so the
        # figure does not rest on the journal (and the phase's CPU covers those commits).
        left, on_table_at = None, None
        if server.warehouse:
            give_up = time.time() + ACKS_ON_TABLE_TIMEOUT
            while (left := deliveries_left(server.warehouse, name)) > 0 and time.time() < give_up:
                time.sleep(0.02)
            on_table_at = time.time() if left == 0 else None
    firsts = [r["first"] for r in reports if r["first"] is not None]
    confirms = [r["last_confirm"] for r in reports if r["last_confirm"] is not None]
    seen = [m for r in reports for m in r["seen"]]
    acked = sum(r["acks_confirmed"] for r in reports)
    out: dict[str, Any] = {"clients": clients, "messages": n, "acks_confirmed": acked, "callbacks": len(seen),
                           "unique_messages": len(set(seen)), "ack_calls": sum(r["ack_calls"] for r in reports),
                           "complete": done and len(reports) == clients}
    if firsts and confirms:
        seconds = max(confirms) - min(firsts)
        out["seconds"] = round(seconds, 3)
        out["msgs_per_s"] = round(min(acked, n) / seconds, 1)
        out["per_client_callbacks"] = sorted(len(r["seen"]) for r in reports)
    else:
        out["msgs_per_s"] = 0.0
    if left is not None:
        out["deliveries_left"] = left  # 0: every ack is on the table
        if on_table_at is not None and firsts and confirms:
            on_table = max(on_table_at, max(confirms)) - min(firsts)
            out["acks_on_table_seconds"] = round(on_table, 3)
            out["msgs_per_s_on_table"] = round(min(acked, n) / on_table, 1)
    phase.record(out, n)
    extra = f", deliveries left on the table: {out['deliveries_left']}" if "deliveries_left" in out else ""
    if "msgs_per_s_on_table" in out:
        extra += f"; {out['msgs_per_s_on_table']:,.0f} msg/s counting until every ack was on the table"
    log(f"server: {server.kind} pull+ack x{clients} {out['msgs_per_s']:,.0f} msg/s ({acked:,} acks confirmed, "
        f"{out['unique_messages']:,}/{n:,} messages{'' if out['complete'] else ', INCOMPLETE'}{extra})")
    return out


def latency_phase(server: Server, sizes: Sizes, clients: int) -> dict[str, Any]:
    from bench.run import latency_stats

    topic, name = topic_path(f"latency-{clients}"), subscription_path(f"latency-{clients}")
    pub, subc = publisher(server.host), subscriber(server.host)
    pub.create_topic(name=topic)
    subc.create_subscription(name=name, topic=topic)
    subc.close()
    subs = Subscribers(server.host, name, clients, latency=True)
    subs.go()
    time.sleep(1.0)  # the streams open (both servers alike)
    data = b"l" * PAYLOAD_BYTES
    published: dict[str, float] = {}
    futures = []
    with Phase(server) as phase:
        t_begin = time.time()
        t_measure, t_end = t_begin + sizes.warmup, t_begin + sizes.warmup + sizes.seconds
        sent = 0
        while (at := time.time()) < t_end:
            # Whatever is due by now: a call slowed by a busy CPU is caught up at once, so the
            # offered rate stays `rate`; each message is timed at its own publish call.
            due = int((at - t_begin) * sizes.rate) - sent
            for _ in range(max(0, due)):
                now = time.time()
                futures.append(pub.publish(topic, data, i=str(sent)))
                if now >= t_measure:
                    published[str(sent)] = now
                sent += 1
            time.sleep(max(0.0, 0.005 - (time.time() - at)))
        subs.wait(subs.received, sent, 30.0)
        reports = subs.finish()
    for f in futures:
        f.result(timeout=30)
    pub.stop()
    seen: dict[str, float] = {}
    for r in reports:
        for i, t in r["seen"]:
            seen[str(i)] = min(t, seen.get(str(i), t))
    out: dict[str, Any] = {"clients": clients, "target_rate": sizes.rate, "actual_rate": round(len(published) / sizes.seconds, 1),
                           "seconds": sizes.seconds, "warmup_seconds": sizes.warmup, **latency_stats(published, seen)}
    phase.record(out, sent)
    log(f"server: {server.kind} latency x{clients} at {out['actual_rate']:.0f} msg/s: p50 {_ms(out['p50_s'])}, "
        f"p99 {_ms(out['p99_s'])}, {out['received']}/{out['messages']} received")
    return out


def _ms(seconds: float | None) -> str:
    return "not received" if seconds is None else f"{seconds * 1000:.0f} ms"


# -- the section -----------------------------------------------------------------------------------
def code_revision() -> dict[str, Any]:
    """The commit the run measured and the server files that differed from it (the server
    is being tuned while it is measured: a figure belongs to its code)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = git("status", "--porcelain", "--", "lib/deltabus")
    return {"commit": git("rev-parse", "HEAD") or None,
            "uncommitted": sorted(line[3:] for line in changed.splitlines() if line[3:].startswith("lib/deltabus/"))}


def start(kind: ServerKind, scratch: Path, emulator: Path) -> Server:
    if kind == "deltabus":
        return DeltabusServer(scratch)
    return EmulatorServer(scratch, emulator)


def run(sizes: Sizes, scratch: Path, kinds: tuple[ServerKind, ...] = SERVER_KINDS, emulator: Path = EMULATOR) -> dict[str, Any]:
    """The server section: every phase on each server of `kinds` in turn. A server that
    cannot start (the emulator not installed) is recorded with its error, and the others
    still run; a phase that fails is recorded so too."""
    out: dict[str, Any] = {"payload_bytes": PAYLOAD_BYTES, "publish_messages": sizes.publish, "pull_messages": sizes.pull,
                           "latency_rate": sizes.rate, "latency_seconds": sizes.seconds, "latency_warmup_seconds": sizes.warmup,
                           "clients": sizes.clients, "client_kind": "processes", "warm_up_messages": sizes.warm,
                           "targets": dict(TARGETS), "code": code_revision(), "servers": {}}
    servers: dict[str, Server] = {}
    try:
        for kind in kinds:
            if kind == "emulator" and not emulator.exists():
                out["servers"][kind] = {"error": f"not installed: {emulator} is missing"}
                log(f"server: the emulator is not installed ({emulator}); deltabus alone")
                continue
            try:
                servers[kind] = start(kind, scratch, emulator)
            except RuntimeError as exc:
                out["servers"][kind] = {"error": str(exc)[-2000:]}
                log(f"server: {kind} did not start: {str(exc)[-400:]}")
                continue
            out["servers"][kind] = {"start_s": servers[kind].started_s}
            log(f"server: {kind} up at {servers[kind].host} in {servers[kind].started_s:.1f} s")

        def each(phase: str, fn: Callable[[Server], Any]) -> None:
            for kind, server in servers.items():
                row = out["servers"][kind]
                if "failed" in row:
                    continue
                try:
                    value = fn(server)
                    if value is not None:
                        row[phase] = value
                except Exception as exc:  # one server's failure is recorded; the other goes on
                    row["failed"] = f"{phase}: {type(exc).__name__}: {exc}"[-2000:]
                    log(f"server: {kind} failed in {phase}: {row['failed'][:400]}\n{server.log_tail(15)}")

        each("warm_up", lambda s: warm_up(s, sizes))
        each("publish", lambda s: publish_phase(s, sizes))
        each("pull_prepare", lambda s: prepare_pull(s, sizes))
        each("pull_1", lambda s: pull_phase(s, sizes, 1))
        each(f"pull_{sizes.clients}", lambda s: pull_phase(s, sizes, sizes.clients))
        each("latency_1", lambda s: latency_phase(s, sizes, 1))
        each(f"latency_{sizes.clients}", lambda s: latency_phase(s, sizes, sizes.clients))
    finally:
        for kind, server in servers.items():
            code = server.stop()
            out["servers"][kind]["exit"] = code
    out["ratios"] = ratios(out)
    return out


def ratios(section: dict[str, Any]) -> dict[str, Any]:
    """deltabus / emulator for the throughputs, and each latency against the p99 target.
    None where either side is missing. deltabus's pull + ack counts until every ack was on
    its table when that was measured (``pull_phase``)."""
    d, e = section["servers"].get("deltabus", {}), section["servers"].get("emulator", {})
    clients = section["clients"]
    out: dict[str, Any] = {}
    for key in ("publish", "pull_1", f"pull_{clients}"):
        row = d.get(key, {})
        # (no committed rate where the acks were not all on the table in time: no ratio)
        a = row.get("msgs_per_s_on_table") if "deliveries_left" in row else row.get("msgs_per_s")
        b = e.get(key, {}).get("msgs_per_s")
        out[key] = round(a / b, 3) if a and b else None
    for key in ("latency_1", f"latency_{clients}"):
        p99 = d.get(key, {}).get("p99_s")
        out[f"{key}_p99_target_met"] = None if key not in d else (p99 is not None and p99 <= TARGETS["p99_s"])
    return out


def table(section: dict[str, Any]) -> str:
    """The section as a Markdown table: deltabus, the emulator, the ratio and the target."""
    d, e = section["servers"].get("deltabus", {}), section["servers"].get("emulator", {})
    c = section["clients"]
    r = section["ratios"]

    def rate(row: dict[str, Any], key: str) -> str:
        if key not in row:
            return "–"
        cell = f"{row[key]['msgs_per_s']:,.0f} msg/s"
        if "msgs_per_s_on_table" in row[key]:
            cell = f"{row[key]['msgs_per_s_on_table']:,.0f} msg/s until every ack was on the table ({cell} as the clients saw it)"
        if row[key].get("complete") is False:
            cell += f" (incomplete: {row[key]['acks_confirmed']:,} acks)"
        return cell

    def lat(row: dict[str, Any], key: str) -> str:
        if key not in row:
            return "–"
        x = row[key]
        missing = "" if x["received"] == x["messages"] else f" ({x['received']:,}/{x['messages']:,} received)"
        return f"p50 {_ms(x['p50_s'])}, p99 {_ms(x['p99_s'])}{missing}"

    def ratio(key: str) -> str:
        return "–" if r.get(key) is None else f"{r[key]:.2f}×"

    def met(ok: bool | None, what: str) -> str:
        return f"{what}: " + ("–" if ok is None else "met" if ok else "not met")

    size = f"{section['payload_bytes']} B"
    rows = ["| what | deltabus | emulator | deltabus / emulator | target |", "| --- | --- | --- | --- | --- |",
            f"| publish, {section['publish_messages']:,} × {size}, default batching | {rate(d, 'publish')} | {rate(e, 'publish')} | "
            f"{ratio('publish')} | {met(None if r['publish'] is None else r['publish'] >= 1, '≥ 1.0×')} |"]
    for n in (1, c):
        key = f"pull_{n}"
        rows.append(f"| streaming pull + ack, {section['pull_messages']:,} × {size}, {n} client{'s' if n > 1 else ''} | "
                    f"{rate(d, key)} | {rate(e, key)} | {ratio(key)} | {met(None if r[key] is None else r[key] >= 1, '≥ 1.0×')} |")
    for n in (1, c):
        key = f"latency_{n}"
        rows.append(f"| publish → callback at {section['latency_rate']:g} msg/s, {n} client{'s' if n > 1 else ''} | "
                    f"{lat(d, key)} | {lat(e, key)} | – | {met(r[f'{key}_p99_target_met'], 'p99 ≤ 100 ms')} |")
    return "\n".join(rows)


def draw(ax_rate: Any, ax_latency: Any, section: dict[str, Any]) -> None:
    """Two panels: msg/s of each throughput phase per server, and latency p50 / p99 per
    client count per server against the p99 target."""
    servers = [k for k in SERVER_KINDS if k in section["servers"] and "error" not in section["servers"][k]]
    c = section["clients"]
    phases = [("publish", "publish"), ("pull_1", "pull+ack x1"), (f"pull_{c}", f"pull+ack x{c}")]
    width = 0.8 / max(1, len(servers))
    for j, kind in enumerate(servers):
        row = section["servers"][kind]
        xs = [i + j * width for i in range(len(phases))]
        ax_rate.bar(xs, [row.get(key, {}).get("msgs_per_s", 0) for key, _ in phases], width=width, label=kind,
                    color="C0" if kind == "deltabus" else "grey")
    ax_rate.set_xticks([i + width * (len(servers) - 1) / 2 for i in range(len(phases))], [label for _, label in phases])
    ax_rate.set_title(f"official client, {section['payload_bytes']} B messages")
    ax_rate.set_xlabel("phase (subscriber processes)")
    ax_rate.set_ylabel("messages per second")
    ax_rate.legend()
    labels, p50, p99, colors = [], [], [], []
    for kind in servers:
        for n in (1, c):
            x = section["servers"][kind].get(f"latency_{n}")
            if x is None:
                continue
            labels.append(f"{kind}\nx{n}")
            p50.append(x["p50_s"] * 1000 if x["p50_s"] is not None else float("nan"))
            p99.append(x["p99_s"] * 1000 if x["p99_s"] is not None else float("nan"))
            colors.append("C0" if kind == "deltabus" else "grey")
    xs = list(range(len(labels)))
    ax_latency.bar([x - 0.2 for x in xs], p50, width=0.4, color=colors, alpha=0.5, label="p50")
    ax_latency.bar([x + 0.2 for x in xs], p99, width=0.4, color=colors, label="p99")
    ax_latency.set_xticks(xs, labels)
    ax_latency.set_yscale("log")  # tens of ms and seconds on one axis; a message never received has no bar
    ax_latency.axhline(TARGETS["p99_s"] * 1000, ls="--", color="red", label="p99 target 100 ms")
    ax_latency.set_title(f"publish -> callback at {section['latency_rate']:g} msg/s")
    ax_latency.set_xlabel("server, subscriber processes")
    ax_latency.set_ylabel("milliseconds (log scale)")
    ax_latency.legend(fontsize=8)
