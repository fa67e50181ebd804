"""A Spark standalone cluster on one machine: a master and N workers, each its own JVM.

Started with Spark's own launcher (``<pyspark>/bin/spark-class``, which pyspark ships; it
ships no ``sbin/`` start scripts) running ``org.apache.spark.deploy.master.Master`` and
``org.apache.spark.deploy.worker.Worker`` on the jars of the pyspark install. Each worker
starts its executors as processes of their own (JVMs, with their Python workers under them).

``StandaloneCluster`` is a context manager: on entry the master is up (its JSON status,
``http://HOST:WEBUI/json/``, says ALIVE) and every worker has registered with it; on exit
every process it started, and every process under them, has ended, also when the block
raised. It is for tests and the README's recipe (``scripts/standalone_cluster.sh``); a
production cluster is run by its own tooling.

Process trees are read from ``/proc`` (Linux): an executor's Python daemon moves itself to
a process group of its own (pyspark's ``daemon.py`` calls ``setpgid``), so killing the
worker's process group would leave it behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Callable, Mapping, NamedTuple, Sequence

from ..errors import InvalidArgument

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The daemons only schedule; C1-only JIT and the serial collector start them faster and
# leaner, as for the driver in conf/spark-defaults.conf.
LEAN_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_MEMORY = re.compile(r"^[1-9][0-9]*[mg]$")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """What to start: `workers` workers of `cores` task slots and `memory` (Spark's "512m",
    "1g") each, all on `host`. `start_timeout`: seconds each daemon gets to come up."""

    workers: int = 2
    cores: int = 2
    memory: str = "1g"
    host: str = "127.0.0.1"
    start_timeout: float = 90.0
    java_options: str = LEAN_JAVA_OPTIONS

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 1 <= self.workers <= 16:
            raise InvalidArgument("workers", f"must be a whole number from 1 to 16, got {self.workers!r}")
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or not 1 <= self.cores <= 256:
            raise InvalidArgument("cores", f"must be a whole number from 1 to 256, got {self.cores!r}")
        if not isinstance(self.memory, str) or not _MEMORY.match(self.memory):
            raise InvalidArgument("memory", f"must be a size such as 512m or 1g, got {self.memory!r}")
        if not isinstance(self.host, str) or not self.host or any(c.isspace() for c in self.host):
            raise InvalidArgument("host", f"must be a host name or IP address, got {self.host!r}")
        if not isinstance(self.start_timeout, (int, float)) or not self.start_timeout > 0:
            raise InvalidArgument("start_timeout", f"must be a number of seconds > 0, got {self.start_timeout!r}")


class WorkerStatus(NamedTuple):
    """One worker as the master's JSON status lists it."""

    id: str
    host: str
    port: int
    cores: int
    cores_used: int
    state: str  # the master's WorkerState: ALIVE, DEAD, DECOMMISSIONED, UNKNOWN


class MasterStatus(NamedTuple):
    url: str  # spark://HOST:PORT
    status: str  # the master's RecoveryState: ALIVE once it accepts workers
    workers: tuple[WorkerStatus, ...]
    active_apps: int


class Daemon(NamedTuple):
    """A master or worker JVM this cluster started."""

    role: str  # "master" or "worker-N"
    process: "subprocess.Popen[bytes]"
    log: Path


class ClusterError(RuntimeError):
    """A daemon did not come up; the message names it and ends with its log's last lines."""


def spark_class() -> Path:
    """``bin/spark-class`` of the pyspark install in use."""
    import pyspark

    path = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
    if not path.exists():
        raise ClusterError(f"{path} is missing: this pyspark install cannot start standalone daemons")
    return path


def free_port(host: str) -> int:
    """A port free on `host` right now (the OS's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return None if fields[0] == b"Z" else int(fields[1])


def process_tree(root: int) -> list[int]:
    """`root` and every live process under it ([] when `root` is gone), parents first."""
    if _parent_of(root) is None:
        return []
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent_of(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    found = [root]
    i = 0
    while i < len(found):
        found.extend(c for c in children.get(found[i], []) if c not in found)
        i += 1
    return found


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(root: int) -> list[int]:
    """SIGKILL `root` and everything under it at once, as a machine's loss would end them.

    The tree is frozen first (SIGSTOP, repeated until no new process appears), so nothing
    it forks meanwhile escapes to init. The pids killed."""
    stopped: list[int] = []
    while True:
        tree = [p for p in process_tree(root) if p not in stopped]
        if not tree:
            break
        _signal(tree, signal.SIGSTOP)
        stopped.extend(tree)
    _signal(stopped, signal.SIGKILL)
    return stopped


def _pdeathsig() -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``, kept across spark-class's exec of java). Without it, an
    owner killed with SIGKILL left its daemons running for good, re-parented to init (seen
    here: two clusters of a killed benchmark run still up 40 minutes later). Their
    executors then end by themselves, as they do when their worker is lost. libc is looked
    up here, in the parent: the forked child only makes the call."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))

    return set_pdeathsig


def _alive(pid: int) -> bool:
    return _parent_of(pid) is not None


class StandaloneCluster:
    """A master and ``settings.workers`` workers; see the module docstring.

    `base_dir`: logs (``master.log``, ``worker-N.log``) and the workers' work dirs (each
    executor's stdout/stderr under ``worker-N/<app>/<executor>/``). `env`: the daemons'
    environment (the caller's, resolved by its entry point); `conf_dir` becomes their
    ``SPARK_CONF_DIR`` (log4j2.properties), and the executors they start inherit both."""

    def __init__(
        self,
        settings: ClusterSettings,
        *,
        base_dir: Path,
        env: Mapping[str, str],
        conf_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.base_dir = Path(base_dir)
        self._env = dict(env)
        self._env["SPARK_DAEMON_JAVA_OPTS"] = settings.java_options
        if conf_dir is not None:
            self._env["SPARK_CONF_DIR"] = str(conf_dir)
        self.master: Daemon | None = None
        self.workers: list[Daemon] = []
        self.web_url = ""
        self.master_url = ""

    # -- starting ---------------------------------------------------------------------
    def _launch(self, role: str, args: Sequence[str]) -> Daemon:
        log = self.base_dir / f"{role}.log"
        with open(log, "ab") as out:
            # A session of its own: a Ctrl-C meant for the caller's terminal does not reach it;
            # stop() ends it and its tree, and it dies with the thread that started it.
            process = subprocess.Popen(
                [str(spark_class()), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self._env, start_new_session=True, preexec_fn=_pdeathsig(),
            )
        return Daemon(role, process, log)

    def _failed(self, daemon: Daemon, what: str) -> ClusterError:
        tail = daemon.log.read_text(errors="replace").splitlines()[-15:]
        return ClusterError(f"{daemon.role} {what}; the last lines of {daemon.log}:\n" + "\n".join(tail))

    def status(self, timeout: float = 5.0) -> MasterStatus:
        """The master's JSON status (raises OSError while it is not answering)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=timeout) as resp:
            doc = json.load(resp)
        workers = tuple(
            WorkerStatus(w["id"], w["host"], int(w["port"]), int(w["cores"]), int(w["coresused"]), w["state"])
            for w in doc.get("workers", [])
        )
        return MasterStatus(doc["url"], doc["status"], workers, len(doc.get("activeapps", [])))

    def _wait(self, daemon: Daemon, what: str, ready: Callable[[MasterStatus], bool]) -> MasterStatus:
        end = time.monotonic() + self.settings.start_timeout
        while True:
            if daemon.process.poll() is not None:
                raise self._failed(daemon, f"exited with {daemon.process.returncode} before {what}")
            try:
                state = self.status(timeout=2.0)
                if ready(state):
                    return state
            except (OSError, ValueError, KeyError):
                pass  # not answering yet
            if time.monotonic() >= end:
                raise self._failed(daemon, f"not {what} within {self.settings.start_timeout:g} s")
            time.sleep(0.2)

    def start(self) -> "StandaloneCluster":
        """Start the master, wait until it is ALIVE, start the workers, wait until each has
        registered. On any failure everything started is stopped before the error is raised."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        host = self.settings.host
        try:
            web_port = free_port(host)
            self.web_url = f"http://{host}:{web_port}"
            self.master = self._launch(
                "master", [MASTER_CLASS, "--host", host, "--port", "0", "--webui-port", str(web_port)]
            )
            self.master_url = self._wait(self.master, "ALIVE", lambda s: s.status == "ALIVE").url
            for n in range(1, self.settings.workers + 1):
                work_dir = self.base_dir / f"worker-{n}"
                work_dir.mkdir(exist_ok=True)
                self.workers.append(self._launch(f"worker-{n}", [
                    WORKER_CLASS, "--host", host, "--cores", str(self.settings.cores),
                    "--memory", self.settings.memory, "--work-dir", str(work_dir), "--webui-port", "0",
                    self.master_url,
                ]))
            want = len(self.workers)
            for worker in self.workers:
                self._wait(worker, "registered", lambda s: sum(w.state == "ALIVE" for w in s.workers) >= want)
        except BaseException:
            self.stop()
            raise
        return self

    # -- losing and stopping ------------------------------------------------------------
    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker `index` (0-based) with its executors and their Python workers: a
        machine lost. The pids killed."""
        daemon = self.workers[index]
        killed = kill_tree(daemon.process.pid)
        daemon.process.wait(10)
        return killed

    def stop(self, timeout: float = 15.0) -> None:
        """End every daemon and everything under it: SIGTERM (workers first, so they stop their
        executors), then SIGKILL what is still alive after `timeout` seconds. Idempotent."""
        daemons = [*self.workers, *([self.master] if self.master else [])]
        trees = {d.process.pid: process_tree(d.process.pid) for d in daemons if d.process.poll() is None}
        _signal(list(trees), signal.SIGTERM)
        everything = [p for tree in trees.values() for p in tree]
        end = time.monotonic() + timeout
        for d in daemons:
            try:
                d.process.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while time.monotonic() < end and any(_alive(p) for p in everything):
            time.sleep(0.1)
        for root in trees:
            if _alive(root):
                kill_tree(root)
        _signal([p for p in everything if _alive(p)], signal.SIGKILL)
        for d in daemons:
            try:
                d.process.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def pids(self) -> list[int]:
        """Every live process this cluster started, and those under them."""
        daemons = [*self.workers, *([self.master] if self.master else [])]
        return [p for d in daemons for p in process_tree(d.process.pid)]

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """``scripts/standalone_cluster.sh``: start a cluster, print its master URL, run until
    SIGINT/SIGTERM, then stop it. `env` is the caller's environment."""
    import argparse

    p = argparse.ArgumentParser(prog="scripts/standalone_cluster.sh", description=main.__doc__)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cores", type=int, default=2, help="task slots per worker")
    p.add_argument("--memory", default="1g", help="memory per worker for its executors (512m, 1g, ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dir", default="build/standalone", help="logs and work dirs (default build/standalone)")
    p.add_argument("--conf-dir", help="SPARK_CONF_DIR of the daemons (log4j2.properties)")
    args = p.parse_args(argv)
    try:
        settings = ClusterSettings(args.workers, args.cores, args.memory, args.host)
    except InvalidArgument as exc:
        print(f"standalone_cluster: --{exc.field.replace('_', '-')}: {exc.rule}", flush=True)
        return 2
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = StandaloneCluster(settings, base_dir=Path(args.dir), env=env,
                                conf_dir=Path(args.conf_dir) if args.conf_dir else None)
    try:
        cluster.start()
        print(f"master {cluster.master_url}  (web UI {cluster.web_url}; logs in {args.dir})", flush=True)
        print(f"{settings.workers} workers of {settings.cores} cores and {settings.memory}; Ctrl-C or SIGTERM stops them", flush=True)
        while not stopping:
            time.sleep(0.2)
    except ClusterError as exc:
        print(f"standalone_cluster: {exc}", flush=True)
        return 1
    finally:
        cluster.stop()
    print("stopped", flush=True)
    return 0
