"""Delta export subscriptions in the push job (issue 17): the job's own ``process`` on delta-rs
(what jobs/deliver.py runs per micro-batch), real Delta tables in temp dirs. Each message is
appended once with Pub/Sub's BigQuery column names and acked; a table that cannot be written
keeps its messages unacked, shows its error in the backlog (SQL) and does not stop the others.
The crash test is test_delta_export_crash.py."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from typing import Iterator

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import config
from deltabus.push.job import DeliveryJob

SETTINGS = dict(engine="delta-rs", backlog_interval=0.0)


def run_until(job: DeliveryJob, done, batches: int = 60) -> None:  # type: ignore[no-untyped-def]
    for batch in range(1, batches + 1):
        job.process(None, batch)
        if done():
            return
    raise AssertionError("the job did not get there")


def landed(table: str) -> pa.Table:
    return DeltaTable(table).to_pyarrow_table()


def test_each_message_is_appended_once_with_pubsubs_columns_then_acked(pub, sub, topic, warehouse, tmp_path):
    meta, plain = str(tmp_path / "with_metadata"), str(tmp_path / "data_only")
    s_meta, s_plain, s_pull = (sub.subscription_path("local", n) for n in ("export-meta", "export-plain", "still-pull"))
    sub.create_subscription(request={"name": s_meta, "topic": topic, "delta_config": {"table": meta, "write_metadata": True}})
    sub.create_subscription(request={"name": s_plain, "topic": topic, "delta_config": {"table": plain}})
    sub.create_subscription(name=s_pull, topic=topic)
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode(), "attributes": {"i": str(i)}} for i in range(2500)])
    job = DeliveryJob(None, config.Settings(warehouse=warehouse, **SETTINGS))  # type: ignore[arg-type]  # no pushes: no Spark
    try:
        run_until(job, lambda: sub.get_backlog(s_meta).num_unacked_messages == 0 == sub.get_backlog(s_plain).num_unacked_messages)
        for batch in range(100, 103):  # more batches: nothing more is appended
            job.process(None, batch)
    finally:
        job.close()
    got = landed(meta)
    assert got.schema.names == ["subscription_name", "message_id", "publish_time", "data", "attributes"]
    assert sorted(got["message_id"].to_pylist()) == sorted(ids)  # each once
    row = next(r for r in got.to_pylist() if r["message_id"] == ids[7])
    assert row["subscription_name"] == s_meta and row["data"] == b"m7" and row["attributes"] == [("i", "7")]
    assert row["publish_time"].tzinfo is not None
    assert landed(plain).schema.names == ["data"] and sorted(landed(plain)["data"].to_pylist()) == sorted(f"m{i}".encode() for i in range(2500))
    assert sub.get_backlog(s_pull).num_unacked_messages == 2500  # a pull subscription is not exported
    rows = {r["subscription"]: r for r in DeltaTable(f"{warehouse}/backlog").to_pyarrow_table().to_pylist()}
    assert rows[s_meta]["last_status"] == "delta ok" and rows[s_meta]["delivered"] == 2500 and rows[s_meta]["last_error"] is None


def test_the_filter_applies_and_clearing_the_config_stops_the_export(pub, sub, topic, warehouse, tmp_path):
    table = str(tmp_path / "filtered")
    s = sub.subscription_path("local", "export-filtered")
    sub.create_subscription(request={"name": s, "topic": topic, "filter": 'attributes.keep = "y"',
                                     "delta_config": {"table": table, "write_metadata": True}})
    kept = pub.publish_batch(topic, [{"data": b"k", "attributes": {"keep": "y"}}] * 5)
    pub.publish_batch(topic, [{"data": b"d", "attributes": {"keep": "n"}}] * 5)
    job = DeliveryJob(None, config.Settings(warehouse=warehouse, **SETTINGS))  # type: ignore[arg-type]
    try:
        run_until(job, lambda: sub.get_backlog(s).num_unacked_messages == 0)
        assert sorted(landed(table)["message_id"].to_pylist()) == sorted(kept)
        sub.update_subscription(subscription={"name": s}, update_mask=["delta_config"])  # a pull subscription again
        pub.publish_batch(topic, [{"data": b"k", "attributes": {"keep": "y"}}])
        for batch in range(200, 203):
            job.process(None, batch)
    finally:
        job.close()
    assert landed(table).num_rows == 5
    assert sub.get_backlog(s).num_unacked_messages == 1  # waits for a puller


@contextmanager
def write_protected(path: str) -> Iterator[None]:
    """Writes under `path` fail with a permission error: chmod for a normal user; root ignores
    modes, so it gets the immutable attribute (chattr +i) instead."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, 0o755)
        return
    if subprocess.run(["chattr", "+i", path], capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: cannot deny a write")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", path], check=True)


def test_unwritable_tables_keep_their_messages_show_the_error_in_sql_and_do_not_stop_the_others(pub, sub, topic, warehouse, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    mismatch, denied, good = str(tmp_path / "mismatch"), str(tmp_path / "denied"), str(tmp_path / "good")
    DeltaTable.create(mismatch, pa.schema([pa.field("data", pa.int64())]))
    DeltaTable.create(denied, pa.schema([pa.field("data", pa.binary())]))
    targets = {"bad-path": str(tmp_path / "a-file" / "t"), "mismatch": mismatch, "denied": denied, "good": good}
    subs = {k: sub.subscription_path("local", f"export-{k}") for k in targets}
    for k, table in targets.items():
        sub.create_subscription(request={"name": subs[k], "topic": topic, "delta_config": {"table": table}})
    pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(300)])
    with write_protected(f"{denied}/_delta_log"):
        job = DeliveryJob(None, config.Settings(warehouse=warehouse, **SETTINGS))  # type: ignore[arg-type]
        try:
            run_until(job, lambda: sub.get_backlog(subs["good"]).num_unacked_messages == 0)
            job.process(None, 500)  # one more: every subscription has had a go
        finally:
            job.close()
    assert landed(good).num_rows == 300
    assert landed(mismatch).num_rows == 0 and landed(denied).num_rows == 0
    for k in ("bad-path", "mismatch", "denied"):
        assert sub.get_backlog(subs[k]).num_unacked_messages == 300, k  # unacked: the backlog shows them

    # The SQL views' backlog is this table (spark/sql.py: SELECT * FROM it); queried here with
    # delta-rs's SQL, which needs no Spark session.
    from deltalake import QueryBuilder

    result = QueryBuilder().register("backlog", DeltaTable(f"{warehouse}/backlog")).execute(
        "SELECT subscription, last_status, last_error, "
        "num_undelivered_messages + num_outstanding_messages + expired_ack_deadlines AS unacked FROM backlog")
    rows = {r["subscription"]: r for r in pa.table(result.read_all()).to_pylist()}
    assert rows[subs["good"]]["last_status"] == "delta ok"
    assert rows[subs["mismatch"]]["last_status"] == "delta schema mismatch"
    assert "'data'" in rows[subs["mismatch"]]["last_error"]
    assert rows[subs["denied"]]["last_status"] == "delta permission denied"
    assert rows[subs["bad-path"]]["last_status"] == "delta not found"
    assert rows[subs["bad-path"]]["unacked"] == 300


@pytest.mark.cluster  # ~40 s of delta-spark MERGEs on this machine: the separate group
@pytest.mark.spark
def test_the_delta_spark_engines_job_exports_too(spark, pub, sub, topic, warehouse, tmp_path):
    from tests.conftest import requires_delta

    requires_delta(spark)
    table = str(tmp_path / "from_delta_spark")
    s = sub.subscription_path("local", "export-on-delta-spark")
    sub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": table, "write_metadata": True}})
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(200)])
    job = DeliveryJob(spark, config.Settings(warehouse=warehouse, engine="delta-spark", backlog_interval=0.0))
    try:
        run_until(job, lambda: sub.get_backlog(s).num_unacked_messages == 0, batches=20)
    finally:
        job.close()
    assert sorted(landed(table)["message_id"].to_pylist()) == sorted(ids)
