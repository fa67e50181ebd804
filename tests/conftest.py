"""Shared fixtures: real Delta warehouses in temp dirs, one local SparkSession per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from deltabus import PublisherClient, SubscriberClient
from deltabus.storage.tables import ALL

ROOT = Path(__file__).resolve().parents[1]

# The suite runs on two pytest-xdist workers (pyproject: -n 2 --dist loadgroup). The tests
# that start whole Spark applications (spark-submit, a notebook kernel, the bench) or run the
# push job against real endpoints form one group, run one after another on one worker, while
# the other worker takes everything else. The push-job tests come last in that group: they
# count a push that waited past its ack deadline in a worker as a nack, and a busy machine
# makes that happen (measured: 1,200-5,200 of 30,000 in the 10k run when both cores were
# busy); by then the other worker has finished (it has 4-5 minutes of work). The group comes
# first in the collection, so a worker starts it at once. Serially the suite took 12 min 50 s.
APPS_FIRST = ("test_notebooks.py", "test_sql.py", "test_quickstart.py", "test_bench_cli.py",
              "test_deliver_signals.py", "test_deliver_job.py")
APPS_LAST = ("test_push_pool.py", "test_push_backoff.py", "test_push.py")
APPS = APPS_FIRST + APPS_LAST


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    apps = [i for i in items if i.path.name in APPS]
    for item in apps:
        item.add_marker(pytest.mark.xdist_group("apps"))
    apps.sort(key=lambda i: APPS.index(i.path.name))  # stable: tests keep their order in a file
    items[:] = apps + [i for i in items if i.path.name not in APPS]


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
def subscription(sub: SubscriberClient, topic: str) -> str:
    name = sub.subscription_path("local", "orders-pull")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    return name


def table_versions(warehouse: str) -> dict[str, int]:
    """The Delta version of every table: equal before and after means nothing was written."""
    from deltalake import DeltaTable

    return {spec.name: DeltaTable(f"{warehouse}/{spec.name}").version() for spec in ALL}


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (starting one takes seconds)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("deltabus-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
    )
    # With the Delta jars (a machine that reaches Maven), the delta-spark engine's contract runs too:
    # DELTABUS_TEST_SPARK_PACKAGES=io.delta:delta-spark_2.13:<version> ./run-tests.sh
    packages = os.environ.get("DELTABUS_TEST_SPARK_PACKAGES")
    if packages:
        builder = (
            builder.config("spark.jars.packages", packages)
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
