"""Shared fixtures: real Delta warehouses in temp dirs, one local SparkSession per test session."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from deltabus import PublisherClient, SubscriberClient
from deltabus.storage.tables import ALL
from tests import background

ROOT = Path(__file__).resolve().parents[1]


class ManualClock:
    """A wall clock tests move by hand, so deadlines pass without sleeping."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def warehouse(tmp_path: Path) -> str:
    return str(tmp_path / "warehouse")


@pytest.fixture
def pub(warehouse: str):
    client = PublisherClient(warehouse=warehouse)
    yield client
    client.stop()


@pytest.fixture
def sub(warehouse: str):
    client = SubscriberClient(warehouse=warehouse, allow_http=False)
    yield client
    client.close()


@pytest.fixture
def psub(warehouse: str):
    """A subscriber allowed plain http endpoints (the push tests' endpoints on 127.0.0.1)."""
    client = SubscriberClient(warehouse=warehouse, allow_http=True)
    yield client
    client.close()


@pytest.fixture
def topic(pub: PublisherClient) -> str:
    name = pub.topic_path("local", "orders")
    pub.create_topic(name=name)
    return name


@pytest.fixture
def clock() -> ManualClock:
    """A wall clock the test moves by hand (tests of deadlines and retry delays)."""
    return ManualClock(time.time())


@pytest.fixture
def csub(warehouse: str, clock: ManualClock) -> Iterator[SubscriberClient]:
    """A subscriber whose clock the test moves."""
    client = SubscriberClient(warehouse=warehouse, clock=clock)
    yield client
    client.close()


@pytest.fixture
def subscription(sub: SubscriberClient, topic: str) -> str:
    name = sub.subscription_path("local", "orders-pull")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    return name


def delivery_state(table):
    """The rows of a deliveries table read whole that are delivery state: without the delivery
    history's ``_attempts-<day>`` partitions (issue 17)."""
    import pyarrow.compute as pc

    from deltabus.storage.tables import HISTORY_PREFIX

    if table.num_rows == 0 or "sub_uid" not in table.column_names:
        return table
    return table.filter(pc.invert(pc.starts_with(table["sub_uid"].cast("string"), HISTORY_PREFIX)))


def table_versions(warehouse: str) -> dict[str, int]:
    """The Delta version of every table: equal before and after means nothing was written."""
    from deltalake import DeltaTable

    # A table the warehouse does not have (one newer than it) is left out: creating it shows.
    return {
        spec.name: DeltaTable(f"{warehouse}/{spec.name}").version()
        for spec in ALL
        if DeltaTable.is_deltatable(f"{warehouse}/{spec.name}")
    }


def _delta_jars() -> tuple[list[str], str | None]:
    """The Delta jars for the tests' SparkSession, fetched on first use into build/delta-jars
    exactly as ./spark-submit.sh does (``deltabus.spark.delta_jars``), and None; or no jars
    and the reason (a machine that reaches no registry): delta-spark cases then skip with it."""
    from deltabus.errors import DeltabusError
    from deltabus.spark.delta_jars import pinned_jars

    try:
        jars = pinned_jars(ROOT / "build" / "delta-jars", sys.executable, os.environ)
    except DeltabusError as e:
        return [], f"delta-spark cannot run on this machine: {e}"
    return [str(j) for j in jars], None


# Tests say which engine they mean. The session below has the Delta jars, so "auto" would
# mean delta-spark for clients made while it is active (their engine comes from
# DELTABUS_ENGINE): pin the embedded engine for the test process; delta-spark cases pass
# engine="delta-spark" (tests that exercise the variable itself set it with monkeypatch).
os.environ["DELTABUS_ENGINE"] = "delta-rs"
DELTA_JARS, DELTA_SKIP = _delta_jars()


def requires_delta(spark) -> None:
    """Skip the calling test, with the reason, where the session has no Delta jars."""
    from deltabus.storage.delta_spark import delta_jvm_available

    if not delta_jvm_available(spark):
        pytest.skip(DELTA_SKIP or "the SparkSession has no Delta jars")


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (starting one takes seconds), with the Delta
    jars and session settings of the delta-spark engine (``DELTA_JARS``) where they could be
    fetched."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from deltabus.spark.delta_jars import SESSION_CONFS

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("deltabus-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        # Delta rebuilds a table's state in a job of this many tasks (default 50) whenever it
        # loads a snapshot (every new table, time-travel read, MERGE): on tables of a few files
        # nearly all of a delta-spark test's time (issue 12, seen: 50-task stages per operation).
        .config("spark.databricks.delta.snapshotPartitions", "2")
    )
    if DELTA_JARS:
        builder = builder.config("spark.jars", ",".join(DELTA_JARS))
        for key, value in SESSION_CONFS.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.hookimpl(trylast=True)  # after -k and -m deselected: only selected tests are arranged
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _choose_jit(items)
    background.arrange(items)


def _choose_jit(items: list[pytest.Item]) -> None:
    """Unless the session selected a `cluster` test, every JVM the tests start through
    spark-submit (the session's, the jobs', the stream workers') compiles with C1 only: they
    live seconds to minutes, and C2's compiles of Spark's and Delta's code cost more CPU than
    they win back there. Measured (2026-11-27, loaded machine): the SQL tests and the engine
    contract suite together 207 s -> 166 s, the delta-spark half of the contract suite alone
    130 s -> 107 s. The `cluster` group's long delta-spark runs keep C2: that group took 865 s
    with C1 against 682 s before (fresh clones, one more test of ~40 s). Decided once the
    selection is known, before the first test (the SparkSession, the early scenarios'
    environment). A child session of out-of-process tests keeps what its parent decided.
    Jobs users run keep the JVM's default."""
    if background.INNER in os.environ:
        return
    if not any(item.get_closest_marker("cluster") for item in items):
        os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """When the background ran: its busy time and when its last scenario ended, which says
    whether the session waited for it (tests/background.py)."""
    timeline = background.EARLY.timeline()
    if timeline:
        start = min(t0 for _, t0, _ in timeline)
        busy = sum(t1 - t0 for _, t0, t1 in timeline)
        longest = sorted(timeline, key=lambda r: r[1] - r[2])[:3]
        # Every scenario's start and end, to balance the two lanes (OUT_OF_PROCESS, BACKGROUND):
        # under build/ for this repository's own sessions, as later sessions prune the temp
        # roots of earlier ones (keeping three).
        own = terminalreporter.config.rootpath == ROOT and background.INNER not in os.environ
        path = (ROOT / "build" if own else background.BASETEMP[0]) / "background-timeline.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([{"name": name, "start_s": round(t0 - start, 1), "end_s": round(t1 - start, 1)}
                                    for name, t0, t1 in timeline], indent=1))
        terminalreporter.write_line(
            f"background: {len(timeline)} scenarios, {busy:.0f} s busy, the last ended "
            f"{max(t1 for _, _, t1 in timeline) - start:.0f} s after the first began; longest: "
            + ", ".join(f"{name} {t1 - t0:.0f} s" for name, t0, t1 in longest)
            + f"; {len(background.EARLY.run_beside_the_lane)} started beside the lane by waiting tests (all: {path})")


@pytest.fixture(scope="session")
def early_background(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[background.Scenarios]:
    """The suite's slow scenarios (tests/background.py)."""
    yield background.start_early(request.session.items, tmp_path_factory)
    background.EARLY.join_all(120)


@pytest.fixture(autouse=True)
def _start_early_background(request: pytest.FixtureRequest) -> None:
    """The first test that does not change the environment starts the early scenarios."""
    if not background.waits_for_environment(request.node):
        request.getfixturevalue("early_background")
