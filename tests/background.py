"""Run a test module's slow, independent scenarios at the same time; each test waits for its own.

Why: the suite runs serially on two cores, and its slowest tests mostly wait (a spark-submit
JVM starting, a lease running out, an endpoint answering late). Measured here: a trivial
spark-submit job costs ~14 CPU-seconds over ~13 s of wall time, and the SIGTERM test's
deliver job ~42 CPU-seconds over its 33 s: a bit over one core. So at most two scenarios run
at a time (`PARALLEL`): two fill the two cores, a third would only slow the others down
(three deliver jobs at once on a loaded machine missed their 180 s wait for 300 pushes).
Each scenario keeps its test's body and assertions unchanged; it runs in a thread started
when the module's first test asks for the fixture, and its test re-raises whatever the
scenario raised (with the scenario's traceback).

Only the scenarios of tests selected in this session start (`-k one_test` runs just it).
DELTABUS_TEST_PARALLEL=1 runs them one at a time, in file order (to compare, or on a
machine whose cores are busy with something else).
Scenarios must be independent: their own warehouse, endpoint, ports and log files.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from deltabus import PublisherClient

Scenario = Callable[[Path], None]

PARALLEL = int(os.environ.get("DELTABUS_TEST_PARALLEL", "2"))


class Scenarios:
    """Threads running scenarios, keyed by the name of the test that checks each."""

    def __init__(self, parallel: int = PARALLEL) -> None:
        self._threads: dict[str, threading.Thread] = {}
        self._errors: dict[str, BaseException] = {}
        self._slots = threading.Semaphore(parallel)

    def start(self, name: str, scenario: Scenario, tmp: Path) -> None:
        def body() -> None:
            with self._slots:  # the others wait for a slot
                try:
                    scenario(tmp)
                except BaseException as exc:  # re-raised by the test that owns the scenario
                    self._errors[name] = exc

        thread = threading.Thread(target=body, name=f"scenario-{name}", daemon=True)
        self._threads[name] = thread
        thread.start()

    def result(self, name: str, timeout: float = 290.0) -> None:
        """Wait for `name`'s scenario and raise what it raised (the suite's per-test timeout is 300 s)."""
        thread = self._threads[name]
        thread.join(timeout)
        assert not thread.is_alive(), f"scenario {name} still running after {timeout:g} s"
        if name in self._errors:
            raise self._errors.pop(name)

    def join_all(self, timeout: float) -> None:
        for thread in self._threads.values():
            thread.join(timeout)


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
