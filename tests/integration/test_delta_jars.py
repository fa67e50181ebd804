"""Fetching the Delta jars for real: Spark's resolver (the tests' session used it) and the
machine's mvn fallback yield the same jars; with no way left, the error names each reason."""

from __future__ import annotations

import shutil

import pytest

from deltabus import config
from deltabus.errors import FailedPrecondition
from deltabus.spark.delta_jars import Package, cached, resolve

from tests.conftest import DELTA_SKIP, ROOT

PACKAGE = Package.parse(config.delta_package(config.default_path()))


def test_no_way_to_fetch_says_why_for_each_and_leaves_no_directory(tmp_path):
    with pytest.raises(FailedPrecondition, match=r"\[delta-spark\] package: could not fetch .*"
                       r"Spark's resolver \(--packages\): .*not found; mvn: .*not found"):
        resolve(PACKAGE, tmp_path, spark_submit=str(tmp_path / "no-spark-submit"), mvn=str(tmp_path / "no-mvn"))
    assert cached(PACKAGE, tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == []  # no half-fetched directory left behind


def artifact(jar: str) -> str:
    """slf4j-api-2.0.13.jar -> slf4j-api"""
    parts = jar.removesuffix(".jar").split("-")
    return "-".join(p for i, p in enumerate(parts) if not any(q[:1].isdigit() for q in parts[: i + 1]))


@pytest.mark.cluster  # a real download of ~35 jars when ~/.m2 is cold: the separate group
def test_mvn_fetches_the_same_jars_as_sparks_resolver(tmp_path):
    if DELTA_SKIP:
        pytest.skip(DELTA_SKIP)
    if shutil.which("mvn") is None:
        pytest.skip("no mvn on this machine: the fallback cannot run here")
    by_spark = cached(PACKAGE, ROOT / "build" / "delta-jars")
    assert by_spark, "the tests' session fetched the jars with Spark's resolver"
    by_mvn = resolve(PACKAGE, tmp_path, spark_submit=None, mvn="mvn")
    # Spark's resolver names a jar group_artifact-version.jar, Maven artifact-version.jar. The
    # artifacts are the same; a version may differ where two dependencies ask for different ones
    # (Ivy takes the newest, Maven the nearest: slf4j-api 2.0.13 vs 1.7.36 here, which Spark's own
    # copy shadows anyway). Delta's own jars are the same versions.
    spark_names = [j.name.split("_", 1)[1] for j in by_spark]
    assert sorted(map(artifact, (j.name for j in by_mvn))) == sorted(map(artifact, spark_names))
    assert {n for n in spark_names if n.startswith("delta-")} == {j.name for j in by_mvn if j.name.startswith("delta-")}
    assert not any(j.name.startswith(("scala-library", "spark-")) for j in by_mvn)  # Spark brings its own
    assert resolve(PACKAGE, tmp_path, spark_submit=None, mvn=None) == by_mvn  # cached: nothing is run
