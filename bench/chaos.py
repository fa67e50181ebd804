"""The chaos suite (issue 16): faults injected again and again, invariants checked from the
endpoint's and the clients' own records (``chaos_check``), never from deltabus's tables alone.

    ./bench/chaos.sh [--quick] [--only kills,concurrent,skew,disk,damaged] [--messages N] [--kills K]
                     [--processes P] [--seconds S] [--out STEM]

Scenarios (each selectable with --only; each prints one summary line; the run writes JSON
to bench/results/<date>-chaos[-quick].json, or --out):

- ``kills``: N messages published over topics with one push subscription each, one per
  failing-endpoint behaviour (``kill_shares``: 2,000 each for the failing ones, the rest
  for the healthy one) (``chaos_endpoint``: healthy, 50% 500s, answers held past the ack deadline, a
  slow drip of the body, a 2xx with a huge body, connections refused for the first
  ``refuse_seconds``) and one whose endpoint fails TLS until its push config is changed to a
  healthy one. ``jobs/deliver.py`` (through ./spark-submit.sh, its own process group) is
  SIGKILLed K times at random moments (whole group: the JVM, the driver, its Python workers;
  every fourth kill only one push worker's Python process), restarted each time, then, with
  its streaming checkpoint damaged (its latest offsets file truncated: the job must set it
  aside and start a new one), run until the endpoint has acked every message of every
  subscription and stopped with SIGTERM to its process group. Checked per
  subscription: 0 lost, 0 acked-then-redelivered without a kill in between, duplicates per
  kill (bounded by the push window in flight at the kill: at most ``MAX_WINDOW`` per
  subscription), and at the end the backlog agrees with the deliveries table (0 unacked).
- ``concurrent``: P processes on one pull subscription for S seconds, beside the push job
  (``jobs/deliver.py`` pushing a push subscription of the same topic to a healthy endpoint,
  SIGKILLed every ``--job-kill-every`` seconds and restarted): library publishers,
  library pullers (pull + acknowledge, recording each receipt with its call's start and
  each confirmed ack), library subscribe() clients, and official google-cloud-pubsub
  subscribe() clients through ``deltabus serve``; a random process is SIGKILLed mid-call
  every few seconds and restarted. Then a clean puller drains what is left. Checked: 0 lost
  (every id whose publish returned was received and acked, and the drain found the
  subscription empty), 0 leases granted twice, 0 acked-then-redelivered, 0 unexpected
  exceptions (any traceback in a process's or the server's output, a raw CommitFailedError
  among them). The push subscription is checked like the kills scenario's (every published
  id pushed and acked, none acked then redelivered without a job kill between, its backlog
  empty, no traceback in the job's log).
- ``skew``: ``chaos_skew.run`` (pullers with wall clocks off by ±``skew`` seconds).
- ``disk`` / ``damaged``: ``chaos_storage`` (a warehouse on a small tmpfs that fills up;
  the push job's streaming checkpoint truncated or deleted, a table's ``_delta_log``
  checkpoint file removed).

The harness is not a test: tests/integration/test_chaos.py runs each scenario small.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple, Sequence, TextIO

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "lib")):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench import procs  # noqa: E402
from bench.chaos_check import Ack, Receipt, check_pulls, check_pushes, is_ack  # noqa: E402
from bench.chaos_endpoint import BEHAVIOURS, ChaosEndpoint, EndpointSettings  # noqa: E402

PROJECT = "chaos"
CheckpointDamage = Literal["none", "delete", "truncate"]
ACK_DEADLINE = 10  # seconds: Pub/Sub's minimum, so held answers and lapsed leases come back soon
# The drain waits out leases of killed clients: a subscribe() client extends its leases up
# to max_duration_per_lease_extension... and Pub/Sub's ack deadline tops out at 600 s.
DRAIN_TIMEOUT = 900.0
UNEXPECTED = re.compile(r"Traceback \(most recent call last\)|CommitFailedError")
# Tracebacks of google-cloud-pubsub racing its own shutdown, not deltabus: subscribe()'s
# consumer thread handing a response's messages to a scheduler that future.cancel() has just
# cleared (its `assert self._scheduler is not None`; the library replaced some of those
# asserts with checks in googleapis/python-pubsub#1244, not this one). Seen once in the
# concurrent scenario's google-client process, when the harness stopped it.
LIBRARY_SHUTDOWN_RACES = ("assert self._scheduler is not None",)


class Io:
    """Where the harness writes its progress lines and which environment its processes get.
    The command leaves both as they are (stdout, the process's environment); a test running a
    scenario beside others gives it a log file and a copy of the environment taken before any
    test changed it (tests/background.py)."""

    log: TextIO | None = None
    env: Mapping[str, str] | None = None


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=Io.log or sys.stdout, flush=True)


def _env(**extra: str) -> dict[str, str]:
    """The environment for a process the harness starts, without PySpark's driver variables."""
    base = Io.env if Io.env is not None else os.environ
    return {**{k: v for k, v in base.items() if not k.startswith("PYSPARK")}, **extra}


# -- the push job ---------------------------------------------------------------------------
def start_job(warehouse: str, log_path: Path, *, until_idle: bool = False, max_seconds: float | None = None) -> subprocess.Popen[bytes]:
    """jobs/deliver.py through ./spark-submit.sh, in a process group of its own (so a kill
    reaches the JVM, the driver and every Python worker)."""
    args = [str(ROOT / "spark-submit.sh"), "jobs/deliver.py", "--warehouse", warehouse, "--allow-http", "--trigger-interval", "0.2",
            "--engine", "delta-rs"]
    if until_idle:
        args.append("--until-idle")
    if max_seconds is not None:
        args += ["--max-seconds", str(max_seconds)]
    env = _env()
    with open(log_path, "ab") as out:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _children(root: int) -> list[tuple[int, str]]:
    """(pid, command line) of every descendant of `root`."""
    now = procs.processes(cmdline=True)
    return [(pid, now[pid].cmd) for pid in procs.descendants(now, root)]


def python_workers(job: subprocess.Popen[bytes]) -> list[int]:
    """The job's Python worker processes (Spark's pyspark.daemon and the workers it forks)."""
    return [pid for pid, cmd in _children(job.pid) if "pyspark.daemon" in cmd or "pyspark/daemon" in cmd or "pyspark.worker" in cmd]


def _sockets_to(port: int) -> set[int]:
    """Inodes of this host's TCP sockets whose remote end is 127.0.0.1:`port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if int(cols[2].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(cols[9]))
    return inodes


def push_workers(job: subprocess.Popen[bytes], job_log: Path) -> list[int]:
    """The job's push workers: its Python worker processes holding a connection to the
    driver's push pool (its port is in the job's "push pool at" log line)."""
    found = re.findall(r"push pool at https?://[^:]+:(\d+)", job_log.read_text(errors="replace"))
    if not found:
        return []
    inodes = _sockets_to(int(found[-1]))
    out = []
    for pid in python_workers(job):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                out.append(pid)
                break
    return out


def kill_group(job: subprocess.Popen[bytes]) -> float:
    """SIGKILL the whole job: its process group (spark-submit, the JVM, the driver) and every
    descendant outside it (pyspark's daemon puts its Python workers, the push workers among
    them, in groups of their own: left alone they finished the pushes in flight after the
    driver was gone). Returns when the signals went out (the kill's time)."""
    descendants = [pid for pid, _ in _children(job.pid)]
    sent = time.time()
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in descendants:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.wait(60)
    return sent


def stop_group(job: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """SIGTERM (the job stops cleanly on it), SIGKILL after `timeout` seconds."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(job)


# -- scenario: job kills under the failing-endpoint mix ---------------------------------------
@dataclass(frozen=True, slots=True)
class KillSettings:
    messages: int
    kills: int
    min_gap: float = 4.0  # seconds of pushing between a (re)start's first push and its kill
    max_gap: float = 15.0
    refuse_seconds: float = 60.0
    flaky_odds: float = 0.5  # the flaky endpoint's share of 500s (on a message's first tries)
    failing_messages: int = 2_000  # messages for each failing behaviour's subscription (kill_shares)
    kill_worker_every: int = 4  # every n-th kill takes one push worker's Python process first
    finish_timeout: float = 1800.0
    # Damage the job's streaming checkpoint before the last restart: "truncate" its latest
    # offsets file (the job must set it aside and start a new one), "delete" it (the new
    # checkpoint's batch ids start at 0 again and must not be taken for replays), or "none".
    damage_checkpoint: CheckpointDamage = "truncate"
    seed: int = 7
    behaviours: tuple[str, ...] = tuple(BEHAVIOURS) + ("tls",)

    def __post_init__(self) -> None:
        if self.failing_messages < 1:
            raise ValueError(f"failing_messages: must be >= 1, got {self.failing_messages}")
        if self.kill_worker_every < 1:
            raise ValueError(f"kill_worker_every: must be >= 1, got {self.kill_worker_every}")
        if self.messages < 1 or self.kills < 0:
            raise ValueError(f"messages must be >= 1 and kills >= 0, got {self.messages}, {self.kills}")
        if not 0 < self.min_gap <= self.max_gap:
            raise ValueError(f"min_gap/max_gap: must be 0 < min_gap <= max_gap, got {self.min_gap}, {self.max_gap}")


def _tls_failing_url(port: int) -> str:
    """An https URL whose TLS handshake fails every time: the endpoint's port speaks plain HTTP."""
    return f"https://127.0.0.1:{port}/ok"


def damage_checkpoint(checkpoint: Path, how: CheckpointDamage) -> str | None:
    """Damage the push job's streaming checkpoint as `how` says; what was done (None: nothing)."""
    if how == "none" or not checkpoint.exists():
        return None
    if how == "delete":
        import shutil

        shutil.rmtree(checkpoint)
        return f"deleted {checkpoint}"
    offsets = sorted((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    if not offsets:
        return None
    offsets[-1].write_bytes(b"")
    return f"truncated {offsets[-1]} to 0 bytes"


def kill_shares(s: KillSettings) -> dict[str, int]:
    """Messages per behaviour's subscription: ``failing_messages`` each for the failing ones
    (at most an even split), the rest to the healthy one. Why not an even split: Pub/Sub's
    push backoff paces a subscription by its nack fraction, and at 50% 500s it pushes
    about once per 4.5 s, so 600 messages took ~100 s here; an even share of 1M would take
    hours, and would measure the backoff, not the kills."""
    even = s.messages // len(s.behaviours)
    failing = [k for k in s.behaviours if k != "ok"]
    each = min(even, s.failing_messages) if "ok" in s.behaviours else even
    out = {k: each for k in failing}
    if "ok" in s.behaviours:
        out["ok"] = s.messages - each * len(failing)
    else:
        out[failing[0]] += s.messages - each * len(failing)
    return out


def kills(scratch: Path, s: KillSettings) -> dict[str, Any]:
    from deltabus import PublisherClient, SubscriberClient
    from deltabus.policy.push_window import MAX_WINDOW

    rng = random.Random(s.seed)
    wh = str(scratch / "warehouse")
    pub = PublisherClient(warehouse=wh)
    sub = SubscriberClient(warehouse=wh, allow_http=True)
    job_log = scratch / "deliver.log"
    with ChaosEndpoint(scratch / "endpoint", EndpointSettings(deadline=ACK_DEADLINE, refuse_seconds=s.refuse_seconds, seed=s.seed,
                                                                         flaky_odds=s.flaky_odds)) as ep:
        # One topic per subscription (kill_shares): N messages are N pushes to ack.
        subs: dict[str, str] = {}
        published: dict[str, list[str]] = {}
        t0 = time.time()
        shares = kill_shares(s)
        for kind in s.behaviours:
            topic = pub.topic_path(PROJECT, f"kills-{kind}")
            pub.create_topic(name=topic)
            name = sub.subscription_path(PROJECT, f"push-{kind}")
            url = _tls_failing_url(ep.port) if kind == "tls" else ep.url(kind)  # type: ignore[arg-type]
            # Every push signs an OIDC token, as production subscriptions do (the signing is on the path).
            sub.create_subscription(request={"name": name, "topic": topic, "ack_deadline_seconds": ACK_DEADLINE,
                                             "push_config": {"push_endpoint": url,
                                                             "oidc_token": {"service_account_email": "chaos@local.iam.gserviceaccount.com"}},
                                             "retry_policy": {"minimum_backoff": "1s", "maximum_backoff": "5s"}})
            subs[kind] = name
            n_kind = shares[kind]
            published[kind] = []
            for start in range(0, n_kind, 10_000):
                n = min(10_000, n_kind - start)
                published[kind] += pub.publish_batch(topic, [{"data": b"k" * 64, "attributes": {"i": str(start + i)}} for i in range(n)])
        log(f"kills: published {sum(map(len, published.values())):,} in {time.time() - t0:.1f} s to {len(subs)} topics, "
            "one push subscription each")

        kill_log: list[dict[str, Any]] = []
        tls_fixed = False
        tls_fixed_at: float | None = None
        started = time.time()

        def fix_tls() -> None:
            nonlocal tls_fixed, tls_fixed_at
            if "tls" in subs and not tls_fixed and time.time() - started > s.refuse_seconds:
                tls_fixed_at = time.time()
                sub.modify_push_config(subscription=subs["tls"], push_config={"push_endpoint": ep.url("ok")})
                tls_fixed = True
                log("kills: the TLS-failing subscription's push endpoint now points at a healthy one")

        for k in range(s.kills):
            job = start_job(wh, job_log)
            began = time.time()
            deadline = began + 300
            while not any(r["t0"] >= began for r in ep.records()) and time.time() < deadline:  # this run's first push
                if job.poll() is not None:
                    raise RuntimeError(f"deliver job exited {job.returncode} before pushing:\n{_tail(job_log)}")
                time.sleep(0.2)
            time.sleep(rng.uniform(s.min_gap, s.max_gap))
            fix_tls()
            workers = push_workers(job, job_log)
            if k % s.kill_worker_every == s.kill_worker_every - 1 and workers:  # one push worker only: Spark retries its task
                victim = rng.choice(workers)
                at = time.time()
                os.kill(victim, signal.SIGKILL)
                kill_log.append({"at": at, "what": "push worker", "pid": victim})
                time.sleep(rng.uniform(s.min_gap, s.max_gap))
                kill_log[-1]["job_survived"] = job.poll() is None  # the pool restarts its workers
            kill_log.append({"at": kill_group(job), "what": "job"})
            log(f"kills: kill {k + 1}/{s.kills} ({kill_log[-1]['what']}), endpoint saw {len(ep.records()):,} requests")

        damaged = damage_checkpoint(Path(wh) / "_checkpoints" / "deliver", s.damage_checkpoint)
        if damaged:
            log(f"kills: before the last restart, {damaged}")
        final_from = job_log.stat().st_size if job_log.exists() else 0
        job = start_job(wh, job_log)
        want = {kind: set(published[kind]) for kind in subs}
        deadline = time.time() + s.finish_timeout
        try:
            while time.time() < deadline:
                fix_tls()
                acked: dict[str, set[str]] = {kind: set() for kind in subs}
                names = {v: k for k, v in subs.items()}
                for r in ep.records():
                    kind = names.get(r["sub"])
                    if kind is not None and is_ack(r["st"]):
                        acked[kind].add(r["m"])
                # Every id acked at the endpoint, and no backlog left: an ambiguous ack (a 2xx
                # whose body outlasted the deadline) counts at the endpoint, but the pusher
                # timed out and the message comes back after its backoff.
                if all(want[k] <= acked[k] for k in subs) and all(sub.get_backlog(n).num_unacked_messages == 0 for n in subs.values()):
                    break
                if job.poll() is not None:
                    raise RuntimeError(f"deliver job exited {job.returncode}:\n{_tail(job_log)}")
                time.sleep(1.0)
            time.sleep(3.0)  # the last acks' MERGEs
        finally:
            stop_group(job)
        elapsed = time.time() - started
        time.sleep(1.0)  # the endpoint's last lines flushed
        records = ep.records()
    kill_times = [k["at"] for k in kill_log]
    out: dict[str, Any] = {"messages": s.messages, "kills": len(kill_log), "kill_log": kill_log, "seconds": round(elapsed, 1),
                           "window_bound_per_subscription": MAX_WINDOW, "tls_fixed_at": tls_fixed_at,
                           "refuse_until": ep.started + s.refuse_seconds, "subscriptions": {}}
    for kind, name in subs.items():
        mine = [r for r in records if r["sub"] == name]
        figures = check_pushes(published[kind], mine, kill_times)
        figures["first_arrival"] = min((r["t0"] for r in mine), default=None)
        stats = sub.get_backlog(name)
        figures["backlog_unacked"] = stats.num_unacked_messages
        figures["backlog_agrees"] = stats.num_unacked_messages == figures["published"] - figures["acked"]
        out["subscriptions"][kind] = figures
    out["lost"] = sum(f["lost"] for f in out["subscriptions"].values())
    out["acked_then_redelivered"] = sum(f["acked_then_redelivered"] for f in out["subscriptions"].values())
    out["duplicates"] = sum(f["duplicates"] for f in out["subscriptions"].values())
    out["backlog_agrees"] = all(f["backlog_agrees"] for f in out["subscriptions"].values())
    # Batches of the last run skipped as "already committed" (none on a new checkpoint).
    out["final_run_skipped_batches"] = job_log.read_text(errors="replace")[final_from:].count("already committed before a restart; skipped")
    out["checkpoint_damage"] = damaged
    out["checkpoint_set_aside"] = "is damaged" in job_log.read_text(errors="replace")[final_from:]
    out["unexpected"] = _unexpected(job_log)
    out["unexpected_lines"] = _unexpected_lines(job_log)[:5]
    out["ok"] = (out["lost"] == 0 and out["acked_then_redelivered"] == 0 and out["backlog_agrees"] and out["unexpected"] == 0
                 and out["final_run_skipped_batches"] == 0)
    sub.close()
    return out


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _unexpected(path: Path) -> int:
    """Tracebacks (and raw CommitFailedErrors) in a log. A SIGKILL writes nothing, so a
    killed process's log holds only what it wrote while running."""
    return len(_unexpected_lines(path))


def _unexpected_lines(path: Path, context: int = 12) -> list[str]:
    """Each unexpected line of a log with the `context` lines after it (the traceback)."""
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    blocks = ["\n".join(lines[i : i + context]) for i, line in enumerate(lines) if UNEXPECTED.search(line)]
    return [b for b in blocks if not any(race in b for race in LIBRARY_SHUTDOWN_RACES)]


# -- scenario: concurrent clients -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConcurrentSettings:
    processes: int
    seconds: float
    kill_every: float = 3.0  # seconds between kills of a random client process
    server: bool = True  # also google-cloud-pubsub subscribe() clients through `deltabus serve`
    # subscribe() clients' FlowControl.max_duration_per_lease_extension (None: the clients'
    # defaults): a killed client's leases run that long at most, so the drain ends sooner.
    lease_cap: int | None = None
    # Beside the push job: a push subscription of the same topic (a healthy endpoint), pushed
    # by jobs/deliver.py on the same warehouse while the clients run, with its own invariants
    # (chaos_check.check_pushes, against the endpoint's records). False: the clients alone.
    push: bool = True
    # Seconds between SIGKILLs of the push job's process group (restarted each time; a kill
    # waits for the run's first push); None: the job runs undisturbed.
    job_kill_every: float | None = 60.0
    push_timeout: float = 900.0  # after the drain: seconds for the endpoint to ack every published id
    seed: int = 11

    def __post_init__(self) -> None:
        if self.processes < 4:
            raise ValueError(f"processes: must be >= 4 (a publisher, two pullers, a subscriber), got {self.processes}")
        if not self.seconds > 0 or not self.kill_every > 0:
            raise ValueError("seconds and kill_every: must be > 0")
        if self.job_kill_every is not None and not self.job_kill_every > 0:
            raise ValueError(f"job_kill_every: must be > 0 seconds or None, got {self.job_kill_every!r}")


CLIENT = ROOT / "bench" / "chaos_client.py"


def _start_client(role: str, wh: str, sub_path: str, topic: str, out: Path, host: str | None, seed: int,
                  lease_cap: int | None = None) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(CLIENT), role, "--warehouse", wh, "--subscription", sub_path, "--topic", topic, "--out", str(out),
            "--seed", str(seed), "--deadline", str(ACK_DEADLINE)]
    if lease_cap is not None:
        args += ["--lease-cap", str(lease_cap)]
    if host:
        args += ["--host", host]
    err = open(out.with_suffix(".err"), "ab")
    return subprocess.Popen(args, cwd=ROOT, stdout=err, stderr=subprocess.STDOUT, env=_env())


def _start_server(wh: str, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    with open(log_path, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "deltabus.cli", "serve", "--warehouse", wh, "--port", "0"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=err, env=_env(PYTHONPATH=str(ROOT / "lib")))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(rb" on 127\.0\.0\.1:(\d+),", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"deltabus serve did not come up: {line!r}\n{_tail(log_path)}")
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return proc, f"127.0.0.1:{int(found.group(1))}"


class _ClientRecords(NamedTuple):
    published: set[str]
    receipts: list[Receipt]
    acks: list[Ack]
    subscribe_acked: set[str]
    errors: int
    ack_called: set[str]  # ids of the acknowledge calls a kill cut (after their commit, maybe)
    cut_ack_calls: int  # runs that ended inside an acknowledge call: at most one per client kill


def _read_client_records(records: Path) -> _ClientRecords:
    """What the client processes recorded (one JSONL file each, and their stderr).

    A puller records each acknowledge call before making it and its return after; the call
    can only be cut by the end of its run (a kill), so only the last call of a run may lack
    its return. One lacking it mid-run is counted as an unexpected error, not as an ack."""
    out = _ClientRecords(set(), [], [], set(), 0, set(), 0)
    errors = cut = 0
    for f in sorted(records.glob("*.jsonl")):
        client = f.stem
        pending: list[str] | None = None  # the ids of this run's acknowledge call in flight
        parsed = []
        for line in f.read_text().splitlines():
            try:
                parsed.append(json.loads(line))
            except ValueError:
                continue  # a line cut by the kill
        # Files of harness versions before the start record: every unanswered call counts as cut.
        runs_marked = any(e["e"] == "start" for e in parsed)
        for e in parsed + [{"e": "start"}]:  # the file's end ends its last run
            if e["e"] == "start":
                if pending is not None:
                    out.ack_called.update(pending)
                    cut += 1
                pending = None
            elif e["e"] == "pub":
                out.published.update(e["ids"])
            elif e["e"] == "recv":
                if e.get("called") is not None:
                    out.receipts.extend(Receipt(client, m, e["called"], e["t"], e["deadline"]) for m in e["ids"])
                else:  # subscribe(): no call start known, so no lease bound either
                    out.receipts.extend(Receipt(client, m, e["t"] - 1e9, e["t"], 0.0) for m in e["ids"])
            elif e["e"] == "ack":
                out.acks.extend(Ack(client, m, e["t"]) for m in e["ids"])
                if pending == e["ids"]:
                    pending = None
            elif e["e"] == "sub-ack":
                out.subscribe_acked.update(e["ids"])
            elif e["e"] == "ack-call":
                if pending is not None:
                    if runs_marked:
                        errors += 1  # an earlier call never returned, yet the run went on
                    else:
                        out.ack_called.update(pending)
                        cut += 1
                pending = e["ids"]
            elif e["e"] == "error":
                errors += 1
        err = f.with_suffix(".err")
        if err.exists():
            errors += _unexpected(err)
    return out._replace(errors=errors, cut_ack_calls=cut)


class _PushBeside:
    """The push job beside the clients: one healthy push subscription on the clients' topic,
    jobs/deliver.py on the same warehouse, SIGKILLed every ``job_kill_every`` seconds (at
    random within 0.5-1.5x, and only once the run has pushed) and restarted."""

    def __init__(self, scratch: Path, wh: str, topic: str, s: ConcurrentSettings, rng: random.Random) -> None:
        from deltabus import SubscriberClient

        self.s, self.rng, self.wh = s, rng, wh
        self.endpoint = ChaosEndpoint(scratch / "endpoint", EndpointSettings(deadline=ACK_DEADLINE, refuse_seconds=0.0, seed=s.seed))
        self.endpoint.__enter__()
        self.requests = scratch / "endpoint" / "requests.jsonl"
        self.log_path = scratch / "deliver.log"
        sub = SubscriberClient(warehouse=wh, allow_http=True)
        self.name = sub.subscription_path(PROJECT, "concurrent-push")
        sub.create_subscription(request={"name": self.name, "topic": topic, "ack_deadline_seconds": ACK_DEADLINE,
                                         "push_config": {"push_endpoint": self.endpoint.url("ok"),
                                                         "oidc_token": {"service_account_email": "chaos@local.iam.gserviceaccount.com"}}})
        sub.close()
        self.kill_times: list[float] = []
        self.job = start_job(wh, self.log_path)
        self._pushed_at_start = self._pushed()
        self._next_kill = self._schedule()

    def _pushed(self) -> int:
        return self.requests.stat().st_size if self.requests.exists() else 0

    def _schedule(self) -> float:
        every = self.s.job_kill_every
        return float("inf") if every is None else time.time() + self.rng.uniform(0.5, 1.5) * every

    def tick(self) -> None:
        """Between client kills: the job's own kill when due, and a check that it is alive."""
        if self.job.poll() is not None:
            raise RuntimeError(f"deliver job exited {self.job.returncode}:\n{_tail(self.log_path)}")
        if time.time() >= self._next_kill and self._pushed() > self._pushed_at_start:
            self.kill_times.append(kill_group(self.job))
            log(f"concurrent: push job killed ({len(self.kill_times)})")
            self.job = start_job(self.wh, self.log_path)
            self._pushed_at_start = self._pushed()
            self._next_kill = self._schedule()

    def finish(self, published: set[str]) -> dict[str, Any]:
        """Wait until the endpoint has acked every published id and the subscription's backlog
        is empty (ids published by a killed publisher before it recorded them are pushed
        too), stop the job with SIGTERM, and check the pushes."""
        from deltabus import SubscriberClient

        sub = SubscriberClient(warehouse=self.wh, allow_http=True)
        deadline = time.time() + self.s.push_timeout
        try:
            while time.time() < deadline:
                acked = {r["m"] for r in self.endpoint.records() if r["sub"] == self.name and is_ack(r["st"])}
                if published <= acked and sub.get_backlog(self.name).num_unacked_messages == 0:
                    break
                if self.job.poll() is not None:
                    raise RuntimeError(f"deliver job exited {self.job.returncode}:\n{_tail(self.log_path)}")
                time.sleep(3.0)
            time.sleep(2.0)  # the last acks' MERGEs
        finally:
            stop_group(self.job)
        time.sleep(1.0)  # the endpoint's last lines flushed
        mine = [r for r in self.endpoint.records() if r["sub"] == self.name]
        figures = check_pushes(published, mine, self.kill_times)
        left = sub.get_backlog(self.name).num_unacked_messages
        sub.close()
        return {**figures, "subscription": self.name, "job_kills": len(self.kill_times), "backlog_unacked": left,
                "unexpected": _unexpected(self.log_path), "unexpected_lines": _unexpected_lines(self.log_path)[:5]}

    def close(self) -> None:
        if self.job.poll() is None:
            kill_group(self.job)
        self.endpoint.__exit__(None, None, None)


def _wait_for_traffic(records: Path, procs: dict[int, tuple[str, "subprocess.Popen[bytes]"]], timeout: float = 180.0) -> None:
    """Wait until a publisher recorded its first publish: the run's seconds count traffic, not
    the clients' start (on a loaded machine their imports alone took over 12 s)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any('"e":"pub"' in f.read_text(errors="replace") for f in records.glob("*.jsonl")):
            return
        for role, proc in procs.values():
            if proc.poll() is not None:
                raise RuntimeError(f"the {role} client exited {proc.returncode} before any publish")
        time.sleep(0.2)
    raise RuntimeError(f"no publish recorded within {timeout:g} s of the clients' start")


def concurrent(scratch: Path, s: ConcurrentSettings) -> dict[str, Any]:
    from deltabus import PublisherClient, SubscriberClient

    rng = random.Random(s.seed)
    wh = str(scratch / "warehouse")
    pub = PublisherClient(warehouse=wh)
    sub = SubscriberClient(warehouse=wh)
    topic = pub.topic_path(PROJECT, "concurrent")
    sub_path = sub.subscription_path(PROJECT, "concurrent")
    pub.create_topic(name=topic)
    sub.create_subscription(name=sub_path, topic=topic, ack_deadline_seconds=ACK_DEADLINE)
    records = scratch / "records"
    records.mkdir()
    server, host = _start_server(wh, scratch / "serve.log") if s.server else (None, None)
    pusher: _PushBeside | None = None
    # Two pullers at least: "granted twice" is judged between pull receipts (their call times).
    roles = ["publisher", "puller", "puller", "subscriber"] + (["grpc-subscriber"] if s.server else [])
    roles += [rng.choice(["publisher", "puller", "puller", "subscriber"] + (["grpc-subscriber", "grpc-publisher"] if s.server else []))
              for _ in range(s.processes - len(roles))]
    procs: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
    push: dict[str, Any] | None = None
    try:
        pusher = _PushBeside(scratch, wh, topic, s, random.Random(s.seed + 5)) if s.push else None
        for i, role in enumerate(roles[: s.processes]):
            procs[i] = (role, _start_client(role, wh, sub_path, topic, records / f"{i}-{role}.jsonl", host, s.seed + i, s.lease_cap))
        kills = 0
        _wait_for_traffic(records, procs)
        started = time.time()
        while time.time() - started < s.seconds:
            time.sleep(rng.uniform(0.5, 1.5) * s.kill_every)
            if pusher is not None:
                pusher.tick()
            if time.time() - started >= s.seconds:
                break
            i = rng.choice(list(procs))
            role, proc = procs[i]
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
                kills += 1
            procs[i] = (role, _start_client(role, wh, sub_path, topic, records / f"{i}-{role}.jsonl", host, s.seed + 1000 + kills,
                                           s.lease_cap))
        for role, proc in procs.values():  # publishers first stop publishing, consumers get a moment
            proc.send_signal(signal.SIGTERM)
        for role, proc in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                kills += 1  # may cut an ack call like any other kill
        # The drain: a clean puller until the subscription gives nothing for two deadlines.
        drain = _start_client("drain", wh, sub_path, topic, records / "drain.jsonl", None, s.seed)
        drain.wait(DRAIN_TIMEOUT)
        got = _read_client_records(records)
        if pusher is not None:
            push = pusher.finish(got.published)
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        try:
            if server is not None:
                server.terminate()
                server.wait(30)
        finally:
            if pusher is not None:
                pusher.close()
    # Acks never confirmed: subscribe()'s (not confirmed to its callback) and acknowledge calls
    # a kill cut (after their commit, maybe). Such an id counts as acked only if the drain then
    # found the subscription empty (it would have got it back otherwise), and never as the
    # confirmed ack a redelivery is judged against (confirmed at +inf).
    confirmed = {a.message_id for a in got.acks}
    unconfirmed = (got.subscribe_acked | got.ack_called) - confirmed
    figures = check_pulls(got.published, got.receipts, got.acks + [Ack("unconfirmed", m, float("inf")) for m in unconfirmed])
    left = sub.get_backlog(sub_path).num_unacked_messages
    out: dict[str, Any] = {"processes": s.processes, "roles": roles[: s.processes], "seconds": s.seconds, "kills": kills,
                           **figures, "backlog_left": left,
                           "cut_ack_calls": got.cut_ack_calls,
                           "acked_by_cut_ack_calls": len((got.ack_called - confirmed - got.subscribe_acked) & got.published),
                           "acked_by_subscribe_callbacks": len((got.subscribe_acked - confirmed) & got.published),
                           "unexpected_exceptions": got.errors + (_unexpected(scratch / "serve.log") if s.server else 0)}
    out["ok"] = out["lost"] == 0 and out["granted_twice"] == 0 and out["acked_then_redelivered"] == 0 and left == 0 \
        and out["unexpected_exceptions"] == 0 and got.cut_ack_calls <= kills
    if push is not None:
        out["push"] = push
        # A kill is due within 1.5x the period once the job has pushed (its start: ~15-60 s).
        push["job_kill_expected"] = s.job_kill_every is not None and s.seconds >= 1.5 * s.job_kill_every + 60
        out["ok"] = out["ok"] and push["lost"] == 0 and push["acked_then_redelivered"] == 0 and push["backlog_unacked"] == 0 \
            and push["unexpected"] == 0 and (push["job_kills"] >= 1 or not push["job_kill_expected"])
    sub.close()
    return out


# -- the command --------------------------------------------------------------------------------
SCENARIOS = ("kills", "concurrent", "skew", "disk", "damaged")


@dataclass(frozen=True, slots=True)
class Options:
    only: tuple[str, ...]
    quick: bool
    messages: int
    kills: int
    processes: int
    seconds: float
    skew: float
    out: Path | None = None
    scratch: Path | None = None
    refuse_seconds: float = 60.0
    failing_messages: int = 2_000
    job_kill_every: float | None = 60.0

    def __post_init__(self) -> None:
        bad = [s for s in self.only if s not in SCENARIOS]
        if bad:
            raise ValueError(f"--only: unknown scenario(s) {', '.join(bad)}; choose from {', '.join(SCENARIOS)}")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(prog="bench/chaos.sh", description="deltabus's chaos suite (issue 16)")
    p.add_argument("--quick", action="store_true", help="small sizes (minutes, not an hour)")
    p.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios ({', '.join(SCENARIOS)})")
    p.add_argument("--messages", type=int, help="messages for the kills scenario (default 1,000,000; --quick 20,000)")
    p.add_argument("--kills", type=int, help="job kills (default 20; --quick 4)")
    p.add_argument("--failing-messages", type=int,
                   help="messages for each failing endpoint's subscription in the kills scenario (default 2,000; --quick 300)")
    p.add_argument("--processes", type=int, help="client processes in the concurrent scenario (default 8; --quick 4)")
    p.add_argument("--seconds", type=float, help="seconds of the concurrent scenario (default 600; --quick 40)")
    p.add_argument("--job-kill-every", type=float,
                   help="concurrent scenario: seconds between kills of the push job beside the clients (default 60; 0: none)")
    p.add_argument("--skew", type=float, default=30.0, help="clock skew in seconds for the skew scenario (default 30)")
    p.add_argument("--refuse-seconds", type=float, help="seconds the refusing endpoint refuses (default 60; --quick 15)")
    p.add_argument("--out", type=Path, help="result stem (default bench/results/<date>-chaos[-quick])")
    p.add_argument("--scratch", type=Path, help="scratch directory (default: a new temp dir, removed)")
    a = p.parse_args(argv)
    try:
        return _options(a)
    except ValueError as exc:  # one line naming the option, exit 2, nothing run
        p.error(str(exc))


def _options(a: argparse.Namespace) -> Options:
    for name in ("messages", "kills", "processes", "failing_messages"):
        v = getattr(a, name)
        if v is not None and v < (0 if name == "kills" else 1):
            raise ValueError(f"--{name.replace('_', '-')}: must be {'>= 0' if name == 'kills' else '>= 1'}, got {v}")
    if a.job_kill_every is not None and a.job_kill_every < 0:
        raise ValueError(f"--job-kill-every: must be >= 0 seconds (0: no kills), got {a.job_kill_every:g}")
    return Options(
        only=tuple(x for x in a.only.split(",") if x), quick=a.quick,
        messages=a.messages or (20_000 if a.quick else 1_000_000), kills=a.kills if a.kills is not None else (4 if a.quick else 20),
        processes=a.processes or (4 if a.quick else 8), seconds=a.seconds or (40.0 if a.quick else 600.0), skew=a.skew,
        out=a.out, scratch=a.scratch, refuse_seconds=a.refuse_seconds if a.refuse_seconds is not None else (15.0 if a.quick else 60.0),
        failing_messages=a.failing_messages or (300 if a.quick else 2_000),
        job_kill_every=(a.job_kill_every or None) if a.job_kill_every is not None else (20.0 if a.quick else 60.0),
    )


def summary(name: str, r: dict[str, Any]) -> str:
    if name == "kills":
        return (f"kills: {'OK' if r['ok'] else 'FAILED'}: {r['messages']:,} messages over {len(r['subscriptions'])} subscriptions, "
                f"{r['kills']} kills: lost {r['lost']}, acked-then-redelivered {r['acked_then_redelivered']}, "
                f"duplicates {r['duplicates']:,}, backlog agrees {r['backlog_agrees']}, {r['seconds']:.0f} s")
    if name == "concurrent":
        return (f"concurrent: {'OK' if r['ok'] else 'FAILED'}: {r['processes']} processes, {r['seconds']:.0f} s, {r['kills']} kills: "
                f"{r['published']:,} published, lost {r['lost']}, granted twice {r['granted_twice']}, "
                f"acked-then-redelivered {r['acked_then_redelivered']}, duplicates {r['duplicates']:,}, "
                f"unexpected exceptions {r['unexpected_exceptions']}, backlog left {r['backlog_left']}"
                + (f"; beside the push job ({r['push']['job_kills']} job kills): pushed {r['push']['acked']:,} of "
                   f"{r['push']['published']:,}, lost {r['push']['lost']}, acked-then-redelivered {r['push']['acked_then_redelivered']}, "
                   f"duplicates {r['push']['duplicates']:,}" if "push" in r else ""))
    if name == "skew":
        return (f"skew: {'OK' if r['ok'] else 'FAILED'}: {r['messages']:,} messages, pullers at +/-{r['skew_seconds']:g} s and 0: "
                f"granted twice {r['leases_granted_twice']}, acked-then-redelivered {r['acked_redelivered']}, lost {r['lost']}, "
                f"duplicates {r['duplicates']}, widest lease pad {r['bound']['widest_lease_pad'] * 1000:.0f} ms")
    return f"{name}: {json.dumps({k: v for k, v in r.items() if not isinstance(v, (list, dict))})}"


def run(opts: Options, scratch: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"date": dt.date.today().isoformat(), "quick": opts.quick, "scenarios": {}}
    runners: dict[str, Callable[[Path], dict[str, Any]]] = {
        "kills": lambda d: kills(d, KillSettings(opts.messages, opts.kills, refuse_seconds=opts.refuse_seconds,
                                                 failing_messages=opts.failing_messages)),
        "concurrent": lambda d: concurrent(d, ConcurrentSettings(opts.processes, opts.seconds, job_kill_every=opts.job_kill_every)),
    }
    if "skew" in opts.only:
        from bench import chaos_skew  # written beside this harness

        def skew(d: Path) -> dict[str, Any]:
            r = chaos_skew.run(d, messages=2_000 if opts.quick else 20_000, skew_seconds=opts.skew)
            r["ok"] = r["leases_granted_twice"] == 0 and r["acked_redelivered"] == 0 and r["lost"] == 0 and r["errors"] == 0
            return r

        runners["skew"] = skew
    if "disk" in opts.only or "damaged" in opts.only:
        from bench import chaos_storage  # written beside this harness

        runners["disk"] = lambda d: chaos_storage.disk(d, messages=300 if opts.quick else 3_000)
        runners["damaged"] = lambda d: chaos_storage.damaged(d, messages=50 if opts.quick else 500)
    for name in opts.only:
        d = scratch / name
        d.mkdir(parents=True, exist_ok=True)
        log(f"{name}: starting")
        r = runners[name](d)
        result["scenarios"][name] = r
        print(summary(name, r), flush=True)
    result["ok"] = all(r.get("ok", True) for r in result["scenarios"].values())
    return result


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    import shutil

    scratch = opts.scratch or Path(tempfile.mkdtemp(prefix="deltabus-chaos-"))
    try:
        result = run(opts, scratch)
    finally:
        if opts.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    stem = opts.out or ROOT / "bench" / "results" / f"{dt.date.today().isoformat()}-chaos{'-quick' if opts.quick else ''}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"results: {stem}.json")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
