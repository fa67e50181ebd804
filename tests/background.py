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
  timing-bound tests fail in a trial). ``move_background_modules_last`` runs those modules
  after all others, so their tests find their scenarios done. Only scenarios that run their
  own processes go early: in-process ones would log into other tests' caplog.
- Within the module (``start_selected`` from a module fixture): its scenarios start, two at a
  time (``PARALLEL``), when the module's first test asks for the fixture.

Only the scenarios of tests selected in this session start (`-k one_test` runs just it).
``BACKGROUND_TESTS = {scenario name: test names}`` names other tests that need a scenario.
DELTABUS_TEST_PARALLEL overrides PARALLEL, DELTABUS_TEST_EARLY_PARALLEL EARLY_PARALLEL (1 and 1:
one at a time, to compare, or on a machine whose cores are busy with something else).
Scenarios must be independent: their own warehouse, endpoint, ports and log files. Each
keeps its test's body and assertions; its test re-raises whatever it raised (with its
traceback) or gets what it returned.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import pytest

from deltabus import PublisherClient

Scenario = Callable[[Path], Any]

PARALLEL = int(os.environ.get("DELTABUS_TEST_PARALLEL", "2"))
EARLY_PARALLEL = int(os.environ.get("DELTABUS_TEST_EARLY_PARALLEL", "1"))
# A test's own limit (the suite's per-test timeout is 300 s) counts from its scenario's start.
SCENARIO_TIMEOUT = 290.0


class Scenarios:
    """Threads running scenarios, keyed by the name of the test that checks each."""

    def __init__(self, parallel: int = PARALLEL) -> None:
        self._threads: dict[str, threading.Thread] = {}
        self._started: dict[str, threading.Event] = {}
        self._start_times: dict[str, float] = {}
        self._cancelled = threading.Event()
        self._errors: dict[str, BaseException] = {}
        self._values: dict[str, Any] = {}
        self._slots = threading.Semaphore(parallel)

    def __contains__(self, name: str) -> bool:
        return name in self._threads

    def start(self, name: str, scenario: Scenario, tmp: Path) -> None:
        started = self._started[name] = threading.Event()

        def body() -> None:
            with self._slots:  # the others wait for a slot
                self._start_times[name] = time.monotonic()
                started.set()
                if self._cancelled.is_set():  # the session is ending: queued scenarios do not start
                    self._errors[name] = RuntimeError(f"scenario {name} not started: the session ended")
                    return
                try:
                    self._values[name] = scenario(tmp)
                except BaseException as exc:  # re-raised by the test that owns the scenario
                    self._errors[name] = exc

        thread = threading.Thread(target=body, name=f"scenario-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()

    def result(self, name: str, timeout: float = SCENARIO_TIMEOUT) -> Any:
        """Wait for `name`'s scenario (at most `timeout` s from its start) and raise what it
        raised, or return what it returned. (Waiting for it to start is bounded by the test's
        own timeout: those queued before it each have their own limit.)"""
        self._started[name].wait()
        thread = self._threads[name]
        thread.join(max(0.0, self._start_times[name] + timeout - time.monotonic()))
        assert not thread.is_alive(), f"scenario {name} still running after {timeout:g} s"
        if name in self._errors:
            raise self._errors[name]
        return self._values.get(name)

    def join_all(self, timeout: float) -> None:
        """Start nothing more and wait, `timeout` s in all, for what is running."""
        self._cancelled.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))


EARLY = Scenarios(EARLY_PARALLEL)
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


def move_background_modules_last(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: modules that change the environment first, modules with early
    scenarios after all the others, each kept whole and in order."""
    early = [item for item in items if _early_scenarios(item.module) is not None]  # type: ignore[attr-defined]
    for item in early:
        # A test waiting for its scenario may wait for those queued before it too; its
        # scenario's own limit (SCENARIO_TIMEOUT from its start) still holds.
        if _waited_for(item.module, item.originalname):  # type: ignore[attr-defined]
            item.add_marker(pytest.mark.timeout(900))
    first = [item for item in items if _changes_environment(item.module)]  # type: ignore[attr-defined]
    rest = [item for item in items if _early_scenarios(item.module) is None and not _changes_environment(item.module)]  # type: ignore[attr-defined]
    items[:] = first + rest + early


def waits_for_environment(item: pytest.Item) -> bool:
    """True for the tests that run before the early scenarios may start."""
    return _changes_environment(item.module)  # type: ignore[attr-defined]


def start_early(items: list[pytest.Item], tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    """Start the early scenarios that this session's selected tests need, in module order."""
    if not _ENV:
        _ENV.update(os.environ)
    modules: dict[ModuleType, set[str]] = {}
    for item in items:
        modules.setdefault(item.module, set()).add(item.originalname)  # type: ignore[attr-defined]
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
