"""Run the suite's slow, independent scenarios in the background from its first test on;
each test that checks one waits for it.

Why: the suite runs serially on two cores, and its slowest tests mostly wait (a spark-submit
JVM starting, a lease running out, an endpoint answering late) or use a core of their own
while the pytest process uses the other. Measured here (idle, 2026-11-26): 952 s of wall time
for 731 CPU-seconds, with the scenarios below about 450 s of it when run inside their modules
(two at a time while the module's other tests waited).

Two ways to run them:
- Early (a module sets ``BACKGROUND = {test name: scenario}``): the session's first test starts
  every selected scenario of every such module, in module order, ``EARLY_PARALLEL`` at a time
  (1: one scenario, about a core, beside the ~600 s of the other tests, which the pytest
  process runs on the other core; two scenarios beside them overloaded the cores and made
  timing-bound tests fail in a trial). A test whose scenario is still queued when it asks
  starts it at once, and a test waiting for a running one starts the queue's last ones
  beside the lane (``Scenarios.result``), so the pytest process's wait is spent on the
  queue; those started by tests count against ``BESIDE`` (2: while tests only wait, the
  pytest process's core is free). ``arrange`` runs those modules after all others, and
  their tests that wait after all their tests that do not, so the waiting tests find their
  scenarios done or help finish the queue. Only scenarios that run their own processes go
  early: in-process ones would log into other tests' caplog.
- Within the module (``start_selected`` from a module fixture): its scenarios start, two at a
  time (``PARALLEL``), when the module's first test asks for the fixture.
- Out of process (a module sets ``OUT_OF_PROCESS = True``): its selected tests run in a pytest
  process of their own (``tests/out_of_process.py``), queued with the early scenarios. In this
  session each becomes a stand-in of the same id that waits for that run and reports the
  test's own outcome (its failure text, skip reason). For modules whose tests run in process
  (a SparkSession, in-process clients) and take long, so they could not be scenarios: their
  logs and environment changes stay in their own process. A session that selects nothing else
  runs them in place, as there is nothing to overlap them with.

Only the scenarios of tests selected in this session start (`-k one_test` runs just it).
``BACKGROUND_TESTS = {scenario name: test names}`` names other tests that need a scenario.
DELTABUS_TEST_PARALLEL overrides PARALLEL, DELTABUS_TEST_EARLY_PARALLEL EARLY_PARALLEL and
DELTABUS_TEST_BESIDE BESIDE (1, 1 and 1: one at a time, to compare, or on a machine whose cores
are busy with something else).
Scenarios must be independent: their own warehouse, endpoint, ports and log files. Each
keeps its test's body and assertions; its test re-raises whatever it raised (with its
traceback) or gets what it returned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest

from deltabus import PublisherClient

Scenario = Callable[[Path], Any]

PARALLEL = int(os.environ.get("DELTABUS_TEST_PARALLEL", "2"))
EARLY_PARALLEL = int(os.environ.get("DELTABUS_TEST_EARLY_PARALLEL", "1"))
# How many queued scenarios waiting tests may run beside the lane at once. While a test waits,
# the pytest process is idle: its core takes one, and the lane's share of the other
# leaves room for a second (fresh clone, 2026-11-27: the pytest process began waiting at
# 750 s of 911 s with the lane and one beside it; the machine used 43% of its two cores
# over the whole CI run).
BESIDE = int(os.environ.get("DELTABUS_TEST_BESIDE", "2"))
# A test's own limit (the suite's per-test timeout is 300 s) counts from its scenario's start.
SCENARIO_TIMEOUT = 290.0
# An out-of-process run is a module's tests one after another (each still has its own 300 s).
OUT_OF_PROCESS_TIMEOUT = 840.0
ROOT = Path(__file__).resolve().parents[1]
# Set in the environment of an out-of-process run: it runs its tests in place.
INNER = "DELTABUS_TEST_INNER"
REPORTS = "DELTABUS_TEST_REPORTS"


class Scenarios:
    """Scenarios run by threads taking turns for a slot, keyed by the name of the test that
    checks each. With ``steal``, a test asking for a scenario that is still queued starts it
    at once, beside the slots (the test's thread would only wait otherwise), and waits for it
    with the same limit; a test waiting for a running one starts queued ones from the back
    of the queue, up to ``BESIDE`` at a time.
    That balances the early lane and the pytest process by themselves: the pytest process
    never idles while scenarios wait for a slot. (Not within a module: its PARALLEL slots
    already fill the two cores while its tests wait.)"""

    def __init__(self, parallel: int = PARALLEL, *, steal: bool = False, beside: int = BESIDE) -> None:
        self._steals = steal  # False: a test waits for its scenario's turn
        self._beside_at_once = beside
        self._threads: dict[str, threading.Thread] = {}
        self._started: dict[str, threading.Event] = {}
        self._done: dict[str, threading.Event] = {}
        self._start_times: dict[str, float] = {}
        self._end_times: dict[str, float] = {}
        self._cancelled = threading.Event()
        self._errors: dict[str, BaseException] = {}
        self._values: dict[str, Any] = {}
        self._slots = threading.Semaphore(parallel)
        self._claims = threading.Lock()
        self._claimed: set[str] = set()
        self._steal: dict[str, Callable[[], threading.Thread]] = {}
        self._order: list[str] = []  # as started: the order tests will ask for them
        self._beside: list[threading.Thread] = []
        self.run_beside_the_lane: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self._threads

    def _claim(self, name: str) -> bool:
        """True for the one caller (a slot's thread or the scenario's test) that runs `name`."""
        with self._claims:
            if name in self._claimed:
                return False
            self._claimed.add(name)
            return True

    def _run(self, name: str, scenario: Scenario, tmp: Path) -> None:
        self._start_times[name] = time.monotonic()
        self._started[name].set()
        try:
            if self._cancelled.is_set():  # the session is ending: queued scenarios do not start
                raise RuntimeError(f"scenario {name} not started: the session ended")
            self._values[name] = scenario(tmp)
        except BaseException as exc:  # re-raised by the test that owns the scenario
            self._errors[name] = exc
        finally:
            self._end_times[name] = time.monotonic()
            self._done[name].set()

    def start(self, name: str, scenario: Scenario, tmp: Path) -> None:
        self._started[name] = threading.Event()
        self._done[name] = threading.Event()

        def body() -> None:
            with self._slots:  # the others wait for a slot
                if self._claim(name):
                    self._run(name, scenario, tmp)

        def steal() -> threading.Thread:  # at once, beside the slots
            self.run_beside_the_lane.append(name)
            thread = threading.Thread(target=self._run, args=(name, scenario, tmp), name=f"scenario-{name}-now", daemon=True)
            thread.start()
            return thread

        self._steal[name] = steal
        self._order.append(name)
        thread = threading.Thread(target=body, name=f"scenario-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()

    def _steal_from_the_back(self) -> None:
        """While a test waits: start the last scenario still queued, if fewer than ``BESIDE``
        started this way are still running. The lane takes scenarios from the front, in the
        order the tests will ask for them; a test waiting for the one the lane runs would find
        each next one already running (measured: a whole CI run in which no test ever found
        its scenario queued, the lane busy 1,029 s and the pytest process waiting)."""
        self._beside = [t for t in self._beside if t.is_alive()]
        if len(self._beside) >= self._beside_at_once:
            return
        for name in reversed(self._order):
            if self._claim(name):
                self._beside.append(self._steal[name]())
                return

    def result(self, name: str, timeout: float = SCENARIO_TIMEOUT) -> Any:
        """Start `name`'s scenario at once if it is still queued; wait for it (at most `timeout`
        s from its start), meanwhile starting queued ones from the back of the queue, up to
        ``BESIDE`` at a time. Raise what it raised, or return what it returned."""
        if self._steals and self._claim(name):
            # Counted with those started beside the lane: lane + this one + the others stay
            # within 1 + BESIDE scenarios at once.
            self._beside.append(self._steal[name]())
        while not self._started[name].wait(0.5):
            if self._steals:
                self._steal_from_the_back()
        deadline = self._start_times[name] + timeout
        while not self._done[name].wait(max(0.0, min(0.5, deadline - time.monotonic()))):
            assert time.monotonic() < deadline, f"scenario {name} still running after {timeout:g} s"
            if self._steals:
                self._steal_from_the_back()
        if name in self._errors:
            raise self._errors[name]
        return self._values.get(name)

    def timeline(self) -> list[tuple[str, float, float]]:
        """(name, start, end) of every scenario that ended, on the monotonic clock, by start."""
        ended = dict(self._end_times)  # scenario threads may still be ending
        return sorted(((n, self._start_times[n], e) for n, e in ended.items()), key=lambda r: r[1])

    def join_all(self, timeout: float) -> None:
        """Start nothing more and wait, `timeout` s in all, for what is running; then interrupt
        the out-of-process runs still going (their tests' fixtures stop what they started)."""
        self._cancelled.set()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        for child in list(_CHILDREN):
            _interrupt(child)


EARLY = Scenarios(EARLY_PARALLEL, steal=True)
_ENV: dict[str, str] = {}


def env() -> dict[str, str]:
    """The environment as it was when the early scenarios started, for the processes they start.
    Tests change os.environ for their own duration (monkeypatch: PUBSUB_EMULATOR_HOST, ...); a
    scenario copying it meanwhile could get their values, or a dict changed mid-copy."""
    return dict(_ENV or os.environ)


def _changes_environment(module: ModuleType) -> bool:
    """Modules that set DELTABUS_* variables to values other tests' clients would refuse
    (``CHANGES_ENVIRONMENT = True``): they run first, before the early scenarios start."""
    return getattr(module, "CHANGES_ENVIRONMENT", False) is True


def _early_scenarios(module: ModuleType) -> dict[str, Scenario] | None:
    found = getattr(module, "BACKGROUND", None)
    return found if isinstance(found, dict) else None


def _waited_for(module: ModuleType, test: str) -> set[str]:
    """The early scenarios of `module` that its test named `test` waits for."""
    scenarios = _early_scenarios(module) or {}
    needed_by: dict[str, set[str]] = getattr(module, "BACKGROUND_TESTS", {})
    return {name for name in scenarios if name == test or test in needed_by.get(name, ())}


def _out_of_process(module: ModuleType) -> bool:
    return INNER not in os.environ and getattr(module, "OUT_OF_PROCESS", False) is True


def _run_name(module: ModuleType) -> str:
    return f"out of process: {module.__name__.rsplit('.', 1)[-1]}"


# Out-of-process runs of this session: run name -> the node ids of the tests it runs.
_RUNS: dict[str, list[str]] = {}
_ROOTDIR: list[Path] = []  # the session's rootdir: node ids are relative to it
BASETEMP: list[Path] = []  # the session's temp root, once the early scenarios started


def arrange(items: list[pytest.Item]) -> None:
    """Reorder `items` in place, after deselection: modules that change the environment first,
    then the others, then the tests of modules with early scenarios that wait for none, then
    those that wait, each group in module order; the tests of out-of-process modules, as
    stand-ins, last.

    Why the waiting tests go after all the others: once the pytest process's own work is done,
    its waits are spent starting queued scenarios from the back (``Scenarios.result``), so the
    session ends with the lane's queue. Kept within their modules, the in-process tests of the
    early modules ran after the lane had ended, the second core idle (about 90 s of a 983 s
    run, 2026-11-26). A module's fixtures may therefore set up twice; none of the early
    modules has one that costs."""
    early: list[pytest.Item] = []
    waiting: list[pytest.Item] = []
    for item in items:
        if _early_scenarios(item.module) is None:  # type: ignore[attr-defined]
            continue
        if _waited_for(item.module, item.originalname):  # type: ignore[attr-defined]
            # A test waiting for its scenario may wait for those queued before it too; its
            # scenario's own limit (SCENARIO_TIMEOUT from its start) still holds.
            item.add_marker(pytest.mark.timeout(900))
            waiting.append(item)
        else:
            early.append(item)
    first: list[pytest.Item] = []
    apart: list[pytest.Item] = []
    rest: list[pytest.Item] = []
    for item in items:  # one pass: list membership tests here cost O(n^2) at every collection
        module = item.module  # type: ignore[attr-defined]
        if _early_scenarios(module) is not None:
            continue
        # A `cluster` test of such a module runs in place: the cluster group's session has
        # its JVM with Delta warm already, and a child would start and warm another beside it.
        alone = _out_of_process(module) and item.get_closest_marker("cluster") is None
        (first if _changes_environment(module) else apart if alone else rest).append(item)
    if not (rest or early or waiting):  # nothing to overlap them with
        rest, apart = rest + apart, []
    stand_ins = []
    if apart:
        _ROOTDIR[:] = [apart[0].config.rootpath]
    for item in apart:
        run = _run_name(item.module)  # type: ignore[attr-defined]
        _RUNS.setdefault(run, []).append(item.nodeid)
        stand_ins.append(_stand_in(item, run))
    items[:] = first + rest + early + waiting + stand_ins


# What a stand-in asks for: early_background and what it needs, and the session's autouse one.
_STAND_IN_FIXTURES = {"early_background", "_start_early_background", "request", "tmp_path_factory"}


def _stand_in(item: pytest.Item, run: str) -> pytest.Function:
    nodeid = item.nodeid

    def stand_in(early_background: Scenarios) -> None:
        outcome(early_background.result(run, OUT_OF_PROCESS_TIMEOUT), nodeid, run)

    def method(self: object, early_background: Scenarios) -> None:
        stand_in(early_background)

    parent = item.parent
    assert parent is not None
    # In a class, pytest calls the test as a method of a new instance.
    callobj = types.MethodType(method, parent.newinstance()) if isinstance(parent, pytest.Class) else stand_in
    # name carries the parameters ("test_x[delta-rs]"): the stand-in's node id is the test's.
    function = pytest.Function.from_parent(parent, name=item.name, callobj=callobj)
    assert function.nodeid == nodeid, (function.nodeid, nodeid)
    # The stand-in sits where the test does, so module and class marks and autouse fixtures
    # apply to it too: an xfail would turn the run's failure into an expected one, a fixture
    # would set up beside the run what the run sets up itself. Such modules run in place.
    marks = {mark.name for mark in function.iter_markers()} & {"skip", "skipif", "xfail", "usefixtures", "filterwarnings"}
    fixtures = set(function.fixturenames) - _STAND_IN_FIXTURES
    if marks or fixtures:
        raise pytest.UsageError(f"{nodeid}: OUT_OF_PROCESS modules cannot have module or class marks "
                                f"{sorted(marks)} or autouse fixtures {sorted(fixtures)}; run it in place")
    function.add_marker(pytest.mark.timeout(OUT_OF_PROCESS_TIMEOUT + 60))
    return function


_CHILDREN: set[subprocess.Popen[bytes]] = set()  # out-of-process runs going on


def _interrupt(child: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """Stop a child pytest as Ctrl-C would, so its tests' fixtures stop the processes they
    started (a SIGKILL would leave their JVMs and servers behind); SIGKILL after `grace` s."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(grace)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run_out_of_process(nodeids: list[str], tmp: Path) -> dict[str, Any]:
    """Run `nodeids` in a pytest process of their own: their reports by node id, its log, its
    exit code, and whether it ran out of time. Each test's outcome comes from its own reports."""
    reports, log = tmp / "reports.jsonl", tmp / "pytest.log"
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.out_of_process",
        f"--basetemp={tmp / 'tmp'}",  # not the numbered default: pytest would prune this session's
        "-o", "addopts=",  # the ids are this session's selection already (-m included)
        *nodeids,
    ]
    environment = env() | {INNER: "1", REPORTS: str(reports)}
    # tests.out_of_process from this repository, whichever rootdir the session has
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")]))
    timed_out = False
    with log.open("wb") as out:
        child = subprocess.Popen(command, cwd=(_ROOTDIR or [ROOT])[0], env=environment, stdout=out, stderr=subprocess.STDOUT)
        _CHILDREN.add(child)
        try:
            child.wait(OUT_OF_PROCESS_TIMEOUT - 60)
        except subprocess.TimeoutExpired:
            timed_out = True
            _interrupt(child)
        finally:
            _interrupt(child)  # a test interrupted the wait: do not leave the run behind
            _CHILDREN.discard(child)
    found: dict[str, list[dict[str, Any]]] = {}
    if reports.exists():
        for line in reports.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # the last line, cut by the run's end: its test shows as incomplete
                continue
            found.setdefault(record["nodeid"], []).append(record)
    return {"reports": found, "log": log, "returncode": child.returncode, "timed_out": timed_out}


def outcome(result: dict[str, Any], nodeid: str, run: str) -> None:
    """Give this test the outcome its out-of-process run reported for it: a failure or skip as
    reported; a pass only when its setup, call and teardown all reported and passed."""
    records: list[dict[str, Any]] = result["reports"].get(nodeid, [])
    log: Path = result["log"]
    for record in records:
        if record["outcome"] == "failed":
            sections = "".join(f"\n--- {title} ---\n{text}" for title, text in record.get("sections", []))
            pytest.fail(f"{record['when']} failed in the {run} run (its log: {log}):\n"
                        f"{record['longrepr']}{sections}", pytrace=False)
    for record in records:
        if record["outcome"] == "skipped":
            if "wasxfail" in record:
                pytest.xfail(record["wasxfail"])
            pytest.skip(record["reason"])
    phases = {r["when"] for r in records if r["outcome"] == "passed"}
    if phases != {"setup", "call", "teardown"}:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
        why = "ran out of time" if result["timed_out"] else f"exited with {result['returncode']}"
        pytest.fail(f"{nodeid} did not complete in the {run} run, which {why} (phases passed: "
                    f"{sorted(phases) or 'none'}); the end of its log ({log}):\n{tail}", pytrace=False)


def waits_for_environment(item: pytest.Item) -> bool:
    """True for the tests that run before the early scenarios may start."""
    return _changes_environment(item.module)  # type: ignore[attr-defined]


def start_early(items: list[pytest.Item], tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    """Start the early scenarios that this session's selected tests need, in module order."""
    if not _ENV:
        _ENV.update(os.environ)
        BASETEMP[:] = [tmp_path_factory.getbasetemp()]
    modules: dict[ModuleType, set[str]] = {}
    for item in items:
        modules.setdefault(item.module, set()).add(item.originalname)  # type: ignore[attr-defined]
    # Out-of-process runs first: the longest work in the queue, their stand-ins run last.
    for run, nodeids in _RUNS.items():
        if run not in EARLY:
            EARLY.start(run, lambda tmp, ids=nodeids: run_out_of_process(ids, tmp), tmp_path_factory.mktemp("out-of-process"))
    for module, selected in modules.items():
        scenarios = _early_scenarios(module) or {}
        needed = set().union(*(_waited_for(module, test) for test in selected))
        for name, scenario in scenarios.items():  # in the module's order
            if name in needed and name not in EARLY:
                EARLY.start(name, scenario, tmp_path_factory.mktemp(name[:40]))
    return EARLY


def start_selected(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                   scenarios: dict[str, Scenario]) -> Iterator[Scenarios]:
    """For a module-scoped fixture: start, at once, the scenarios whose tests were selected."""
    selected = {item.originalname for item in request.session.items if item.module is request.module}  # type: ignore[attr-defined]
    running = Scenarios()
    for name, scenario in scenarios.items():
        if name in selected:
            running.start(name, scenario, tmp_path_factory.mktemp(name[:40]))
    yield running
    running.join_all(60)


class Warehouse:
    """What the conftest fixtures pub, topic and warehouse give a test, for a scenario's own dir."""

    def __init__(self, tmp: Path) -> None:
        self.path = str(tmp / "warehouse")
        self.pub = PublisherClient(warehouse=self.path)
        self.topic = self.pub.topic_path("local", "orders")
        self.pub.create_topic(name=self.topic)

    def __enter__(self) -> "Warehouse":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pub.stop()


def in_warehouse(body: Callable[[PublisherClient, str, str, Path], None]) -> Scenario:
    """A scenario written as a test taking (pub, topic, warehouse, tmp_path)."""

    def scenario(tmp: Path) -> None:
        with Warehouse(tmp) as w:
            body(w.pub, w.topic, w.path, tmp)

    return scenario
