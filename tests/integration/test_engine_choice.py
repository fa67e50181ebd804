"""Which engine open_engine picks, how forcing one fails here, and delta-spark's staleness check."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import deltabus
from deltabus import config
from deltabus.errors import InvalidArgument
from deltabus.storage import ENGINES, choose_engine, open_engine
from deltabus.storage.delta_spark import moved

# Sets DELTABUS_* variables to values clients refuse: runs before the early scenarios start
# (tests/background.py), whose in-process clients read them.
CHANGES_ENVIRONMENT = True


def test_auto_is_delta_rs_without_spark_and_env_forces_a_choice(warehouse, monkeypatch):
    monkeypatch.delenv("DELTABUS_ENGINE", raising=False)
    assert open_engine(warehouse).name == "delta-rs"
    monkeypatch.setenv("DELTABUS_ENGINE", "delta-rs")
    assert choose_engine(None, None) == "delta-rs"
    monkeypatch.setenv("DELTABUS_ENGINE", "hive")
    with pytest.raises(InvalidArgument, match="DELTABUS_ENGINE"):
        open_engine(warehouse)
    with pytest.raises(InvalidArgument, match="engine"):
        open_engine(warehouse, engine="parquet")


# Run in a Spark of its own: the tests' session has the Delta jars, and a process has one
# SparkContext. A plain local session (no --jars, no extensions), as a user's Spark without
# Delta is; it reports what auto chose and what forcing delta-spark raised.
NO_JARS_CHILD = """
import json, sys
from pyspark.sql import SparkSession
from deltabus.errors import FailedPrecondition
from deltabus.storage import choose_engine, open_engine

spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
out = {"auto": choose_engine("auto", spark), "jars": spark.conf.get("spark.jars", "")}
try:
    open_engine(sys.argv[1], engine="delta-spark", spark=spark)
    out["error"] = None
except FailedPrecondition as e:
    out["error"] = str(e)
spark.stop()
print(json.dumps(out))
"""


def test_forcing_delta_spark_without_the_jars_says_how_to_get_them(tmp_path):
    """A real Spark without the Delta jars, in a separate JVM (~10 s: the cheapest real one;
    a stand-in session object would be a mock)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(deltabus.__file__).parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", NO_JARS_CHILD, str(tmp_path / "w2")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "delta" not in got["jars"]  # the child's Spark really lacks the jars
    assert got["auto"] == "delta-rs"
    assert got["error"] is not None and re.search("--packages io.delta:delta-spark", got["error"]), got
    assert not (tmp_path / "w2").exists()  # nothing written


def test_settings_engine_is_validated_and_matches_storage():
    assert config.ENGINES == ENGINES
    assert config.load(None, {"DELTABUS_ENGINE": "delta-spark"}).engine == "delta-spark"
    with pytest.raises(InvalidArgument, match="engine"):
        config.load(None, {"DELTABUS_ENGINE": "spark"})


def test_moved_sees_only_the_partitions_and_app_transactions_a_write_touches(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"p": ["a", "b"], "x": [1, 2]}), partition_by=["p"])
    before = DeltaTable(uri)
    write_deltalake(uri, pa.table({"p": ["b"], "x": [3]}), mode="append", partition_by=["p"])
    after = DeltaTable(uri)
    assert not moved(before, after, "p", ["a"], [])
    assert moved(before, after, "p", ["b"], [])
    DeltaTable(uri).delete("p = 'a'")
    assert moved(before, DeltaTable(uri), "p", ["a"], [])
    from deltalake import CommitProperties, Transaction

    write_deltalake(uri, pa.table({"p": ["b"], "x": [4]}), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction("cursor", 5)]))
    assert moved(after, DeltaTable(uri), "p", ["zz"], ["cursor"])
    assert not moved(after, DeltaTable(uri), "p", ["zz"], ["other"])


def test_choose_engine_reads_no_setting_and_open_engine_resolves_none_once(warehouse, monkeypatch):
    """Storage below open_engine is pure: None is "auto" whatever DELTABUS_ENGINE says; only
    open_engine (an entry point for scripts and tests) resolves the variable, naming it."""
    monkeypatch.setenv("DELTABUS_ENGINE", "hive")
    assert choose_engine(None, None) == "delta-rs"
    assert open_engine(warehouse, engine="delta-rs").name == "delta-rs"  # a given name: the variable is not read
    with pytest.raises(InvalidArgument) as e:
        open_engine(warehouse)
    assert e.value.field == "DELTABUS_ENGINE"
