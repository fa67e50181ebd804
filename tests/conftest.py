"""Shared fixtures: real Delta warehouses in temp dirs, one local SparkSession per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from deltabus import PublisherClient, SubscriberClient
from deltabus.storage.tables import ALL

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
