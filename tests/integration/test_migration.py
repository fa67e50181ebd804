"""Versioned table schemas: a warehouse written by older code opens, migrates and works.

tests/data/warehouse-e32aae7 was written by deltabus at commit e32aae7 (before versions;
see tests/data/README.md). Each test copies what it needs to a temp dir: the data itself
is never written.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.schema import Field

from deltabus import PublisherClient, SubscriberClient
from deltabus.errors import FailedPrecondition
from deltabus.storage import open_engine
from deltabus.storage.delta_rs import DeltaRsEngine
from deltabus.storage.delta_spark import add_columns_sql
from deltabus.storage.tables import ALL, BACKLOG, BY_NAME, SCHEMA_VERSION_KEY, plan_migration
from tests.conftest import requires_delta, table_versions
from tests.integration.test_engine_contract import delta_spark_tables  # noqa: F401 - a fixture

OLD = Path(__file__).resolve().parents[1] / "data" / "warehouse-e32aae7"
TOPIC = "projects/p/topics/orders"
PULL = "projects/p/subscriptions/pull-sub"
PUSH = "projects/p/subscriptions/push-sub"


@pytest.fixture
def old_warehouse(tmp_path: Path) -> str:
    target = tmp_path / "old"
    shutil.copytree(OLD, target)
    return str(target)


def layout(warehouse: str) -> dict[str, tuple[list[str], str | None]]:
    """Every table's column names and recorded schema version."""
    out = {}
    for spec in ALL:
        if not DeltaTable.is_deltatable(f"{warehouse}/{spec.name}"):
            continue  # a table newer than the warehouse (snapshots, issue 15): opening creates it
        dt = DeltaTable(f"{warehouse}/{spec.name}")
        out[spec.name] = ([f.name for f in dt.schema().fields], dt.metadata().configuration.get(SCHEMA_VERSION_KEY))
    return out


def current_layout() -> dict[str, tuple[list[str], str | None]]:
    return {spec.name: (spec.schema.names, str(spec.version)) for spec in ALL}


def v1_backlog(warehouse: str) -> None:
    """A backlog table as round 1 first made it: version 1's columns, no version property, one row."""
    schema = pa.schema(BACKLOG.layers[0])
    DeltaTable.create(f"{warehouse}/backlog", schema, name="backlog")
    row = {f.name: None for f in schema} | {"subscription": "projects/p/subscriptions/old", "num_undelivered_messages": 3}
    write_deltalake(f"{warehouse}/backlog", pa.Table.from_pylist([row], schema=schema), mode="append")


def test_old_warehouse_migrates_and_keeps_working(old_warehouse):
    before = table_versions(old_warehouse)
    old_columns = {name: columns for name, (columns, _) in layout(old_warehouse).items()}
    pub = PublisherClient(warehouse=old_warehouse, create_warehouse=False)
    sub = SubscriberClient(warehouse=old_warehouse, allow_http=True)
    try:
        # What the old code stored reads back (the first call opens the warehouse)...
        pull = sub.get_subscription(subscription=PULL)
        # ... after migrating it: every table records the code's schema version and has its columns.
        assert layout(old_warehouse) == current_layout()
        # One commit for the version, and one before it for the columns where some were missing.
        added = {name: int(BY_NAME[name].schema.names != columns) for name, columns in old_columns.items()}
        created = {spec.name: 0 for spec in ALL if spec.name not in before}  # new tables: created at version 0
        assert created == {"snapshots": 0, "snapshot_messages": 0}
        assert table_versions(old_warehouse) == {name: v + 1 + added[name] for name, v in before.items()} | created
        assert (pull.ack_deadline_seconds, dict(pull.labels), pull.push_config.is_push) == (30, {"team": "data"}, False)
        push = sub.get_subscription(subscription=PUSH)
        assert push.push_config.push_endpoint == "http://127.0.0.1:9/push"
        assert push.push_config.oidc_token is not None and push.push_config.oidc_token.service_account_email == "a@b.c"

        # The pull subscription still holds its 5 unacked messages: 1 nacked and 2 expired
        # (second delivery), 2 never delivered (first).
        got = sub.pull(subscription=PULL, max_messages=10, return_immediately=True).received_messages
        assert sorted(r.message.data for r in got) == [b"m1", b"m2", b"m3", b"m4", b"m5"]
        assert sorted(r.delivery_attempt for r in got) == [1, 1, 2, 2, 2]
        assert all(r.message.attributes["seq"] == r.message.data.decode()[1:] for r in got)
        sub.acknowledge(subscription=PULL, ack_ids=[r.ack_id for r in got])
        assert sub.pull(subscription=PULL, max_messages=10, return_immediately=True).received_messages == []

        # New messages flow: published after the migration, received and acked.
        pub.publish_batch(TOPIC, [{"data": b"new-1"}, {"data": b"new-2"}])
        fresh = sub.pull(subscription=PULL, max_messages=10, return_immediately=True).received_messages
        assert sorted(r.message.data for r in fresh) == [b"new-1", b"new-2"]
        assert [r.delivery_attempt for r in fresh] == [1, 1]
        sub.acknowledge(subscription=PULL, ack_ids=[r.ack_id for r in fresh])

        # Settings change, and the old rows' other fields stay.
        updated = sub.update_subscription(
            subscription={"name": PULL, "ack_deadline_seconds": 60, "labels": {"team": "ops"}},
            update_mask=["ack_deadline_seconds", "labels"],
        )
        assert (updated.ack_deadline_seconds, dict(updated.labels), updated.topic) == (60, {"team": "ops"}, TOPIC)
        assert sub.get_subscription(subscription=PULL) == updated

        # Backlog: computed and written with version 2's columns.
        stats = {b.subscription: b for b in sub.refresh_backlog()}
        assert stats[PULL].num_undelivered_messages == 0 and stats[PULL].num_outstanding_messages == 0
        rows = DeltaTable(f"{old_warehouse}/backlog").to_pyarrow_table().to_pylist()
        assert {r["subscription"] for r in rows} == {PULL, PUSH}
        assert set(BACKLOG.schema.names) <= set(rows[0])
    finally:
        pub.stop()
        sub.close()


def test_migration_writes_nothing_the_second_time(old_warehouse):
    open_engine(old_warehouse, engine="delta-rs", create=False)
    migrated = table_versions(old_warehouse)
    open_engine(old_warehouse, engine="delta-rs", create=False).ensure_tables()
    assert table_versions(old_warehouse) == migrated


def test_a_version_1_table_gains_the_columns_of_later_versions(warehouse):
    v1_backlog(warehouse)
    engine = open_engine(warehouse, engine="delta-rs", create=True)
    dt = DeltaTable(engine.table_uri("backlog"))
    assert [f.name for f in dt.schema().fields] == BACKLOG.schema.names
    assert dt.metadata().configuration[SCHEMA_VERSION_KEY] == "3"  # 3 since issue 13's dead-letter figures
    # Columns first, then the version: two commits after the create and the row.
    assert [h["operation"] for h in dt.history()][:2] == ["SET TBLPROPERTIES", "ADD COLUMN"]
    (old,) = engine.snapshot("backlog").read().to_pylist()
    assert old["num_undelivered_messages"] == 3 and old["backoff_until"] is None and old["last_status"] is None
    # And the new columns are written: the backlog of a push subscription fills them.
    pub = PublisherClient(warehouse=warehouse)
    sub = SubscriberClient(warehouse=warehouse, allow_http=True)
    try:
        pub.create_topic(name=TOPIC)
        sub.create_subscription(name=PULL, topic=TOPIC)
        sub.refresh_backlog()
        assert {r["subscription"] for r in engine.snapshot("backlog").read().to_pylist()} == {PULL}
    finally:
        pub.stop()
        sub.close()


def test_a_migration_cut_between_its_two_commits_is_completed(warehouse):
    # What a crash after ADD COLUMNS and before SET TBLPROPERTIES leaves: the columns, no version.
    v1_backlog(warehouse)
    DeltaTable(f"{warehouse}/backlog").alter.add_columns([Field.from_arrow(f) for layer in BACKLOG.layers[1:] for f in layer])
    dt = DeltaTable(f"{warehouse}/backlog")
    plan = plan_migration(BACKLOG, [f.name for f in dt.schema().fields], dt.metadata().configuration)
    assert plan is not None and plan.add == () and plan.set_version and plan.from_version == 1
    open_engine(warehouse, engine="delta-rs", create=True)
    assert layout(warehouse)["backlog"] == (BACKLOG.schema.names, "3")


def test_a_table_of_a_newer_version_is_refused_and_nothing_is_written(old_warehouse):
    spec = BY_NAME["deliveries"]
    DeltaTable(f"{old_warehouse}/deliveries").alter.set_table_properties(
        {SCHEMA_VERSION_KEY: str(spec.version + 1)}, raise_if_not_exists=False
    )
    before = table_versions(old_warehouse)
    with pytest.raises(FailedPrecondition, match=r"deliveries .*newer deltabus.*upgrade deltabus"):
        open_engine(old_warehouse, engine="delta-rs", create=False)
    sub = SubscriberClient(warehouse=old_warehouse)
    with pytest.raises(FailedPrecondition, match="newer deltabus"):
        sub.get_subscription(subscription=PULL)
    sub.close()
    assert table_versions(old_warehouse) == before  # not even the older tables were stamped


def test_a_version_that_is_not_a_number_is_refused(warehouse):
    open_engine(warehouse, engine="delta-rs", create=True)
    DeltaTable(f"{warehouse}/topics").alter.set_table_properties({SCHEMA_VERSION_KEY: "two"}, raise_if_not_exists=False)
    with pytest.raises(FailedPrecondition, match="topics.*'two' is not a version number"):
        open_engine(warehouse, engine="delta-rs", create=False)


@pytest.mark.parametrize("start", ["old", "empty"])
def test_processes_migrating_or_creating_at_once_all_succeed(old_warehouse, start):
    if start == "old":
        shutil.rmtree(f"{old_warehouse}/backlog")
        v1_backlog(old_warehouse)
    else:  # racing to create every table
        shutil.rmtree(old_warehouse)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def migrate() -> None:
        engine = DeltaRsEngine(old_warehouse)  # each its own handles, as another process would have
        barrier.wait()
        try:
            engine.ensure_tables()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert layout(old_warehouse) == current_layout()
    ops = [h["operation"] for h in DeltaTable(f"{old_warehouse}/backlog").history()]
    assert ops.count("ADD COLUMN") == (start == "old")  # the losers re-read and found the work done
    assert ops.count("CREATE TABLE") == 1


def test_delta_spark_add_columns_statement():
    sql = add_columns_sql("delta.`/w/backlog`", BACKLOG.layers[1])
    assert sql == (
        "ALTER TABLE delta.`/w/backlog` ADD COLUMNS "
        "(`backoff_until` timestamp, `backoff_reason` string, `last_status` string, `last_error` string)"
    )


@pytest.mark.spark
def test_delta_spark_migrates_an_old_warehouse(request, tmp_path):
    spark = request.getfixturevalue("spark")
    requires_delta(spark)
    warehouse = str(tmp_path / "w")
    # The other tables as delta-spark created them (once for the run: a Spark create costs
    # seconds); the backlog as round 1 made it, which the open migrates with ALTER TABLE.
    template = request.getfixturevalue("delta_spark_tables")
    for spec in ALL:
        if spec.name != "backlog":
            shutil.copytree(template / spec.name, f"{warehouse}/{spec.name}")
    v1_backlog(warehouse)
    engine = open_engine(warehouse, engine="delta-spark", spark=spark)
    assert layout(warehouse) == current_layout()
    before = table_versions(warehouse)
    engine.ensure_tables()
    assert table_versions(warehouse) == before
