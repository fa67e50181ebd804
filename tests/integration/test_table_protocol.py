"""Both engines make tables the other reads and writes: the protocol and properties each
creates are pinned here, and each engine reads state that only the other's checkpoint holds.

Why pinned: delta-rs 1.6 cannot read or write some table features Delta 4.4 offers (v2
checkpoints, deletion vectors, row tracking, in-commit timestamps, domain metadata). A table
that gains one, by a default of a newer Delta or of a session, would lock one engine out of
the warehouse; such a change fails here first. delta-spark cases use the tables it created
once for the run (test_engine_contract.delta_spark_tables) and few Spark writes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltabus.storage import open_engine
from deltabus.storage.tables import ALL, MESSAGES, TS
from tests.conftest import requires_delta
from tests.integration.test_engine_contract import (  # noqa: F401 - delta_spark_tables is a fixture
    INSERT,
    delta_spark_tables,
    on,
    rows,
    state,
)

# (minReaderVersion, minWriterVersion, readerFeatures, writerFeatures, table properties):
# legacy protocol versions, no table features. Writer 4 on messages is change data feed's.
PINNED = {
    "topics": (1, 2, None, None, {"deltabus.schemaVersion": "2"}),  # 2: message_retention_duration (issue 15)
    # 2: retry_policy, dead_letter_policy, filter (issue 13); 3: detached (issue 14)
    # 4: expiration_policy, last_active; 5: message_retention_duration, retain_acked_messages,
    # enable_exactly_once_delivery (issue 15)
    "subscriptions": (1, 2, None, None, {"deltabus.schemaVersion": "6"}),  # 6: delta_config (issue 17)
    "messages": (1, 4, None, None, {"delta.enableChangeDataFeed": "true", "deltabus.schemaVersion": "1"}),
    "deliveries": (1, 2, None, None, {"delta.targetFileSize": "65536", "deltabus.schemaVersion": "3"}),  # 2: dead_letter_key (issue 13); 3: attempt_* (the delivery history, issue 17)
    "backlog": (1, 2, None, None, {"deltabus.schemaVersion": "3"}),  # 3: dead_lettered, dead_letter_blocked (issue 13)
    "backlog_history": (1, 2, None, None, {"deltabus.schemaVersion": "3"}),  # 3: as backlog
    "snapshots": (1, 2, None, None, {"deltabus.schemaVersion": "1"}),  # issue 15
    "snapshot_messages": (1, 2, None, None, {"deltabus.schemaVersion": "1"}),  # issue 15
}


def protocols(warehouse: str | Path) -> dict[str, tuple[object, ...]]:
    """Each table's protocol and properties, as its latest version records them."""
    out: dict[str, tuple[object, ...]] = {}
    for spec in ALL:
        dt = DeltaTable(f"{warehouse}/{spec.name}")
        p = dt.protocol()
        out[spec.name] = (p.min_reader_version, p.min_writer_version, p.reader_features, p.writer_features,
                          dict(dt.metadata().configuration))
    return out


def messages(ids: list[str], topic_uid: str = "t1") -> pa.Table:
    n = len(ids)
    return pa.table(
        {"topic_uid": [topic_uid] * n, "topic": ["projects/p/topics/t"] * n, "message_id": ids,
         "data": [i.encode() for i in ids], "attributes": pa.array([[]] * n, MESSAGES.schema.field("attributes").type),
         "ordering_key": [""] * n, "publish_time": pa.array([1] * n, TS), "size_bytes": pa.array([1] * n, pa.int64())},
        schema=MESSAGES.schema,
    )


def copy_of(template: Path, tmp_path: Path, name: str) -> str:
    target = tmp_path / name
    shutil.copytree(template, target)
    return str(target)


def drop_commits_up_to(table_uri: str, version: int) -> None:
    """Delete the commit files up to `version`, as log cleanup does once they are past
    retention: the table's state up to there is then only in the checkpoint at `version`."""
    log = Path(table_uri) / "_delta_log"
    for v in range(version + 1):
        (log / f"{v:020d}.json").unlink()


def test_delta_rs_creates_the_pinned_protocol_and_properties(warehouse):
    open_engine(warehouse, engine="delta-rs")
    assert protocols(warehouse) == PINNED


def test_delta_spark_creates_the_pinned_protocol_and_properties(spark, delta_spark_tables):
    requires_delta(spark)
    assert protocols(delta_spark_tables) == PINNED


@pytest.mark.cluster  # the cluster-engine group: minutes of delta-spark writes here
def test_each_engine_writes_and_reads_tables_the_other_created(spark, delta_spark_tables, tmp_path):
    requires_delta(spark)
    by_spark = copy_of(delta_spark_tables, tmp_path, "by-spark")
    by_rs = str(tmp_path / "by-rs")
    open_engine(by_rs, engine="delta-rs")
    # delta-rs writes on delta-spark's tables; delta-spark writes on delta-rs's.
    rs = open_engine(by_spark, engine="delta-rs")
    rs.snapshot("deliveries").merge(rows("sa", ["1", "2"]), on("sa"), INSERT)
    rs.append("messages", messages(["m1"]))
    ds = open_engine(by_rs, engine="delta-spark", spark=spark)
    ds.snapshot("deliveries").merge(rows("sa", ["3"]), on("sa"), INSERT)
    ds.append("messages", messages(["m2"]))
    # Each reads what the other wrote (Spark with its own Delta reader: the delta-spark
    # engine's snapshot reads go through delta-rs).
    got = spark.read.format("delta").load(f"{by_spark}/deliveries").where("sub_uid = 'sa'").select("message_id", "delivery_attempt")
    assert sorted((r.message_id, r.delivery_attempt) for r in got.collect()) == [("1", 0), ("2", 0)]
    assert state(open_engine(by_rs, engine="delta-rs"), "sa") == [("3", 0)]
    assert DeltaTable(f"{by_rs}/messages").to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist() == ["m2"]
    # Writing changed no table's protocol or properties.
    assert protocols(by_spark) == PINNED
    assert protocols(by_rs) == PINNED


@pytest.mark.cluster  # the cluster-engine group
def test_each_engine_reads_state_only_the_other_engines_checkpoint_holds(spark, delta_spark_tables, tmp_path):
    requires_delta(spark)
    warehouse = copy_of(delta_spark_tables, tmp_path, "w")
    ds = open_engine(warehouse, engine="delta-spark", spark=spark)

    # delta-spark's checkpoint, read by delta-rs. delta-rs commits versions 1..9 (one with an
    # app transaction); delta-spark commits version 10 and checkpoints it (every 10 commits by
    # default); delta-rs commits 11 past it.
    uri = f"{warehouse}/messages"
    assert DeltaTable(uri).version() == 0
    for i in range(1, 10):
        props = CommitProperties(app_transactions=[Transaction("cursor", i)]) if i == 5 else None
        write_deltalake(uri, messages([f"m{i}"]), mode="append", commit_properties=props)
    ds.append("messages", messages(["m10"]))
    log = Path(uri) / "_delta_log"
    # A classic one-file checkpoint: not a v2 (UUID-named, with sidecars) nor a multi-part one.
    assert sorted(p.name for p in log.glob("*.checkpoint*.parquet")) == [f"{10:020d}.checkpoint.parquet"]
    write_deltalake(uri, messages(["m11"]), mode="append")
    drop_commits_up_to(uri, 10)
    dt = DeltaTable(uri)
    assert dt.version() == 11
    assert sorted(dt.to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist()) == sorted(f"m{i}" for i in range(1, 12))
    assert dt.transaction_version("cursor") == 5

    # delta-rs's checkpoint, read by delta-spark: commits with an app transaction, a
    # checkpoint, a commit past it.
    uri = f"{warehouse}/deliveries"
    rs = open_engine(warehouse, engine="delta-rs")
    rs.snapshot("deliveries").merge(rows("sa", ["1", "2"]), on("sa"), INSERT, app_txn=("job", 7))
    rs.snapshot("deliveries").merge(rows("sb", ["3"]), on("sb"), INSERT)
    checkpointed = DeltaTable(uri)
    checkpointed.create_checkpoint()
    rs.snapshot("deliveries").merge(rows("sa", ["4"]), on("sa"), INSERT)
    drop_commits_up_to(uri, checkpointed.version())
    got = spark.read.format("delta").load(uri).select("sub_uid", "message_id").toArrow()
    assert sorted(zip(got["sub_uid"].to_pylist(), got["message_id"].to_pylist())) == [
        ("sa", "1"), ("sa", "2"), ("sa", "4"), ("sb", "3")]
    # delta-spark saw the app transaction in that checkpoint: it skips a write of that version.
    latest = DeltaTable(uri).version()
    ds.write("deliveries", rows("sa", ["5"]), "append", ("job", 7))
    assert DeltaTable(uri).version() == latest
