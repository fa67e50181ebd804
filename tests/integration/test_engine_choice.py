"""Which engine open_engine picks, how forcing one fails here, and delta-spark's staleness check."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus import config
from deltabus.errors import FailedPrecondition, InvalidArgument
from deltabus.storage import ENGINES, choose_engine, open_engine
from deltabus.storage.delta_spark import delta_jvm_available, moved


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


def test_forcing_delta_spark_without_the_jars_says_how_to_get_them(spark, warehouse, tmp_path):
    if delta_jvm_available(spark):
        pytest.skip("this Spark has the Delta jars")
    assert choose_engine("auto", spark) == "delta-rs"
    with pytest.raises(FailedPrecondition, match="--packages io.delta:delta-spark"):
        open_engine(str(tmp_path / "w2"), engine="delta-spark", spark=spark)
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
