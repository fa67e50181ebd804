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


def test_a_table_that_keeps_failing_dead_letters_its_messages_and_ordering_holds(pub, csub, clock, topic, warehouse, tmp_path):
    """The export leases through the pull path: a message its table refuses comes back after
    its ack deadline with one more delivery attempt, and after max_delivery_attempts goes to
    the dead-letter topic, as Pub/Sub does with a BigQuery subscription's failed writes. An
    ordered subscription lands each key's messages in publish order."""
    dl_topic = pub.topic_path("local", "export-dead-letters")
    pub.create_topic(name=dl_topic)
    dl_sub = csub.subscription_path("local", "export-dead-letters-pull")
    csub.create_subscription(name=dl_sub, topic=dl_topic)
    mismatch, ordered = str(tmp_path / "mismatch"), str(tmp_path / "ordered")
    DeltaTable.create(mismatch, pa.schema([pa.field("data", pa.int64())]))
    s_bad, s_ordered = csub.subscription_path("local", "export-poisoned"), csub.subscription_path("local", "export-ordered")
    csub.create_subscription(request={"name": s_bad, "topic": topic, "delta_config": {"table": mismatch},
                                      "dead_letter_policy": {"dead_letter_topic": dl_topic, "max_delivery_attempts": 5}})
    csub.create_subscription(request={"name": s_ordered, "topic": topic, "enable_message_ordering": True,
                                      "delta_config": {"table": ordered, "write_metadata": True}})
    ids = pub.publish_batch(topic, [{"data": f"{k}-{i}".encode(), "ordering_key": k} for i in range(20) for k in ("a", "b")])
    job = DeliveryJob(None, config.Settings(warehouse=warehouse, **SETTINGS), clock=clock)  # type: ignore[arg-type]
    copies: list[object] = []
    try:
        for batch in range(1, 40):
            job.process(None, batch)
            clock.advance(11)  # past the 10 s ack deadline: the refused messages come back
            copies += csub.pull(subscription=dl_sub, max_messages=100, return_immediately=True).received_messages
            if len(copies) == len(ids) and csub.get_backlog(s_ordered).num_unacked_messages == 0:
                break
    finally:
        job.close()
    assert landed(mismatch).num_rows == 0
    assert sorted(c.message.data for c in copies) == sorted(f"{k}-{i}".encode() for i in range(20) for k in ("a", "b"))  # type: ignore[attr-defined]
    assert {c.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] for c in copies} == {"5"}  # type: ignore[attr-defined]
    assert csub.get_backlog(s_bad).num_unacked_messages == 0
    got = in_commit_order(ordered)
    assert sorted(r["message_id"] for r in got) == sorted(ids)
    for key in ("a", "b"):
        seq = [r["data"].decode() for r in got if r["data"].decode().startswith(key)]
        assert seq == [f"{key}-{i}" for i in range(20)]


def in_commit_order(table: str) -> list[dict[str, object]]:
    """The table's rows by the commit that added them (each export batch is one commit of one
    file, whose rows keep the batch's order)."""
    seen: set[object] = set()
    rows: list[dict[str, object]] = []
    for version in range(DeltaTable(table).version() + 1):
        for r in DeltaTable(table, version=version).to_pyarrow_table().to_pylist():
            if r["message_id"] not in seen:
                seen.add(r["message_id"])
                rows.append(r)
    return rows


def test_bad_delta_configs_through_the_client_name_field_and_rule_and_write_nothing(sub, topic, warehouse):
    from deltabus.errors import InvalidArgument
    from tests.conftest import table_versions

    s = sub.subscription_path("local", "export-refused")
    push = sub.subscription_path("local", "push-not-export")
    sub.create_subscription(request={"name": push, "topic": topic, "push_config": {"push_endpoint": "https://example.com/p"}})
    before = table_versions(warehouse)
    cases = [
        ({"name": s, "topic": topic, "delta_config": {"table": "dataset.table"}}, "delta_config.table", "absolute path or a URI"),
        ({"name": s, "topic": topic, "delta_config": {"table": "/t", "write_metadata": 1}}, "delta_config.write_metadata", "boolean"),
        ({"name": s, "topic": topic, "delta_config": {"table": "/t"}, "push_config": {"push_endpoint": "https://example.com/p"}},
         "delta_config", "either push"),
    ]
    for request, field, rule in cases:
        with pytest.raises(InvalidArgument) as e:
            sub.create_subscription(request=request)
        assert e.value.field == field and rule in e.value.rule
    with pytest.raises(InvalidArgument) as e:
        sub.update_subscription(subscription={"name": push, "delta_config": {"table": "/t"}}, update_mask=["delta_config"])
    assert e.value.field == "subscription.delta_config" and "either push" in e.value.rule
    once = sub.subscription_path("local", "exactly-once-pull")
    sub.create_subscription(request={"name": once, "topic": topic, "enable_exactly_once_delivery": True})
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:  # Pub/Sub's export subscriptions have no exactly-once delivery
        sub.update_subscription(subscription={"name": once, "delta_config": {"table": "/t"}}, update_mask=["delta_config"])
    assert e.value.field == "subscription.delta_config" and "exactly-once" in e.value.rule
    assert table_versions(warehouse) == before  # nothing written
    sub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": "/t"}})
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:  # and the other way round: an export cannot get an endpoint
        sub.modify_push_config(subscription=s, push_config={"push_endpoint": "https://example.com/p"})
    assert e.value.field == "push_config"
    assert table_versions(warehouse) == before and sub.get_subscription(subscription=s).push_config.push_endpoint == ""


def test_one_job_exports_a_subscription_a_second_job_skips_it_with_its_reason(pub, sub, topic, warehouse, tmp_path):
    """Two jobs (own checkpoints) on one export subscription: the first to claim it in the
    table's log exports it all; the other appends nothing and says why in the backlog."""
    table = str(tmp_path / "shared")
    s = sub.subscription_path("local", "export-two-jobs")
    sub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": table, "write_metadata": True}})
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(3000)])
    jobs = [DeliveryJob(None, config.Settings(warehouse=warehouse, checkpoint_dir=str(tmp_path / f"ckpt-{n}"),  # type: ignore[arg-type]
                                              max_pushes_per_batch=500, **SETTINGS)) for n in (1, 2)]
    try:
        for batch in range(1, 20):
            for job in jobs:
                job.process(None, batch)
            if sub.get_backlog(s).num_unacked_messages == 0:
                break
        else:
            raise AssertionError("not exported")
    finally:
        for job in jobs:
            job.close()
    got = landed(table)["message_id"].to_pylist()
    assert sorted(got) == sorted(ids)  # none skipped, none twice


def test_a_batch_appended_by_a_job_that_died_before_its_ack_is_not_appended_again_by_another_job(pub, csub, clock, topic, warehouse, tmp_path):
    """The reviewer's repro: job A appends 5 and dies before its ack; the ack deadline passes;
    job B (own checkpoint) must not lease and append them; A restarts and acks. 5 rows."""
    from deltabus.push.exporter import DeltaExporter, export_subscriptions

    table = str(tmp_path / "t")
    s = csub.subscription_path("local", "export-crash-two")
    csub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": table, "write_metadata": True}})
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(5)])
    subs = lambda: export_subscriptions(csub._registry.subscriptions())  # noqa: E731

    class Died(Exception):
        pass

    a = DeltaExporter(csub.engine, str(tmp_path / "ckpt-a" / "exports"), clock=clock)

    def die(*args: object, **kw: object) -> None:
        raise Died()

    a._client.acknowledge = die  # type: ignore[method-assign]  # the process dies between append and ack
    with pytest.raises(Died):
        a.run(subs(), 100)
    a.close()
    assert landed(table).num_rows == 5
    clock.advance(11)  # past the 10 s ack deadline
    b = DeltaExporter(csub.engine, str(tmp_path / "ckpt-b" / "exports"), clock=clock)
    out = b.run(subs(), 100).outcomes
    b.close()
    (o,) = out.values()
    assert o.appended == 0 and o.status == "delta error" and "another deliver job" in (o.error or "")
    a2 = DeltaExporter(csub.engine, str(tmp_path / "ckpt-a" / "exports"), clock=clock)
    a2.run(subs(), 100)
    a2.close()
    assert sorted(landed(table)["message_id"].to_pylist()) == sorted(ids)
    assert csub.get_backlog(s).num_unacked_messages == 0


def test_the_cli_creates_shows_and_clears_a_delta_export(sub, topic, warehouse, tmp_path):
    import io
    import json

    from deltabus import cli

    table = str(tmp_path / "from_cli")
    out = io.StringIO()
    assert cli.main(["--warehouse", warehouse, "subscriptions", "create", "export-cli", "--topic", "orders",
                     "--delta-table", table, "--delta-write-metadata"], out=out) == 0
    assert "created Delta export subscription projects/local/subscriptions/export-cli" in out.getvalue()
    shown = io.StringIO()
    assert cli.main(["--warehouse", warehouse, "subscriptions", "get", "export-cli"], out=shown) == 0
    assert json.loads(shown.getvalue())["delta_config"] == {"table": table, "write_metadata": True, "drop_unknown_fields": False}
    assert cli.main(["--warehouse", warehouse, "subscriptions", "update", "export-cli", "--delta-table", table,
                     "--delta-drop-unknown-fields"], out=io.StringIO()) == 0
    cfg = sub.get_subscription(subscription="projects/local/subscriptions/export-cli").delta_config
    assert cfg is not None and cfg.drop_unknown_fields and cfg.write_metadata  # left out: kept
    assert cli.main(["--warehouse", warehouse, "subscriptions", "update", "export-cli", "--clear-delta-export"], out=io.StringIO()) == 0
    assert sub.get_subscription(subscription="projects/local/subscriptions/export-cli").delta_config is None
    assert cli.main(["--warehouse", warehouse, "subscriptions", "create", "export-cli-2", "--topic", "orders",
                     "--delta-table", "relative/t"], out=io.StringIO()) == 1  # refused, one line, nothing created
    assert [s.name for s in sub.list_subscriptions(project="local")] == ["projects/local/subscriptions/export-cli"]


def test_the_cli_update_names_the_delta_table_flag_in_its_error(sub, topic, warehouse, capsys):
    from deltabus import cli

    assert cli.main(["--warehouse", warehouse, "subscriptions", "create", "export-cli-3", "--topic", "orders"]) == 0
    capsys.readouterr()
    assert cli.main(["--warehouse", warehouse, "subscriptions", "update", "export-cli-3", "--delta-table", "rel/t"]) == 1
    err = capsys.readouterr().err
    assert "--delta-table" in err and "delta_config.table" not in err


def test_the_cli_update_of_the_table_alone_keeps_write_metadata(sub, topic, warehouse, tmp_path):
    from deltabus import cli

    name = "projects/local/subscriptions/export-cli-4"
    assert cli.main(["--warehouse", warehouse, "subscriptions", "create", "export-cli-4", "--topic", "orders",
                     "--delta-table", str(tmp_path / "a"), "--delta-write-metadata"]) == 0
    assert cli.main(["--warehouse", warehouse, "subscriptions", "update", "export-cli-4", "--delta-table", str(tmp_path / "b")]) == 0
    cfg = sub.get_subscription(subscription=name).delta_config
    assert cfg is not None and cfg.table == str(tmp_path / "b") and cfg.write_metadata  # before: silently turned off
    assert cli.main(["--warehouse", warehouse, "subscriptions", "update", "export-cli-4", "--delta-table", str(tmp_path / "b"),
                     "--no-delta-write-metadata"]) == 0
    assert not sub.get_subscription(subscription=name).delta_config.write_metadata


def test_an_export_subscription_cannot_be_pulled_from_so_a_puller_cannot_land_a_batch_twice(pub, sub, topic, warehouse, tmp_path):
    """As Pub/Sub's BigQuery/Cloud Storage subscriptions: only the export leases. Before, a
    pull after the export appended a batch (and died before its ack) got the same messages."""
    from deltabus.errors import FailedPrecondition

    s = sub.subscription_path("local", "export-only")
    sub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": str(tmp_path / "t")}})
    pub.publish_batch(topic, [{"data": b"x"}])
    with pytest.raises(FailedPrecondition, match="Delta export subscription"):
        sub.pull(subscription=s, max_messages=10, return_immediately=True)
    with pytest.raises(FailedPrecondition, match="Delta export subscription"):
        sub.subscribe(s, lambda m: m.ack())
    assert sub.get_backlog(s).num_unacked_messages == 1  # nothing leased by the refused calls
    sub.update_subscription(subscription={"name": s}, update_mask=["delta_config"])
    assert len(sub.pull(subscription=s, max_messages=10, return_immediately=True).received_messages) == 1  # cleared: a pull subscription


def _exporter(csub, clock, tmp_path):  # type: ignore[no-untyped-def]
    from deltabus.push.exporter import DeltaExporter

    return DeltaExporter(csub.engine, str(tmp_path / "ckpt" / "exports"), clock=clock)


def _subs(csub):  # type: ignore[no-untyped-def]
    from deltabus.push.exporter import export_subscriptions

    return export_subscriptions(csub._registry.subscriptions())


class _Died(Exception):
    pass


def _die(*args: object, **kw: object) -> None:
    raise _Died()


def test_a_batch_appended_to_table_a_is_acked_after_the_config_moved_to_table_b(pub, csub, clock, topic, warehouse, tmp_path):
    """Appended to A, died before the ack, delta_config moved to B: the restart settles the
    pending batch against A (its nonce in A's log) and acks it; B gets nothing of it."""
    a_t, b_t = str(tmp_path / "a"), str(tmp_path / "b")
    s = csub.subscription_path("local", "export-switch-1")
    csub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": a_t, "write_metadata": True}})
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(5)])
    e = _exporter(csub, clock, tmp_path)
    e._client.acknowledge = _die  # type: ignore[method-assign]
    with pytest.raises(_Died):
        e.run(_subs(csub), 100)
    e.close()
    csub.update_subscription(subscription={"name": s, "delta_config": {"table": b_t, "write_metadata": True}}, update_mask=["delta_config"])
    clock.advance(11)
    e2 = _exporter(csub, clock, tmp_path)
    for _ in range(3):
        e2.run(_subs(csub), 100)
    e2.close()
    assert sorted(landed(a_t)["message_id"].to_pylist()) == sorted(ids)
    assert not os.path.exists(b_t) or landed(b_t).num_rows == 0  # before: acked never, so appended to B too
    assert csub.get_backlog(s).num_unacked_messages == 0


def test_a_batch_never_appended_is_not_acked_when_the_new_table_records_a_higher_batch(pub, csub, clock, topic, warehouse, tmp_path):
    """Batches 1..4 went to B; the config moves to A, batch 5 is leased and the job dies
    before appending it; the config moves back to B, which records this job's app id at >= 5.
    The restart must not ack batch 5 on B's number: its message must come back and land."""
    b_t, a_t = str(tmp_path / "b"), str(tmp_path / "a")
    s = csub.subscription_path("local", "export-switch-2")
    csub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": b_t, "write_metadata": True}})
    e = _exporter(csub, clock, tmp_path)
    first = []
    for i in range(4):  # batches 1..4 to B
        first += pub.publish_batch(topic, [{"data": f"b{i}".encode()}])
        e.run(_subs(csub), 100)
    e.close()
    assert landed(b_t).num_rows == 4
    csub.update_subscription(subscription={"name": s, "delta_config": {"table": a_t, "write_metadata": True}}, update_mask=["delta_config"])
    lost = pub.publish_batch(topic, [{"data": b"lost?"}])
    from deltabus.push import export_table

    e2 = _exporter(csub, clock, tmp_path)
    real_append = export_table.append_once
    export_table.append_once = _die  # type: ignore[assignment]  # the job dies after the pending file, before the append
    try:
        with pytest.raises(_Died):
            e2.run(_subs(csub), 100)
    finally:
        export_table.append_once = real_append
    e2.close()
    # Meanwhile B got a higher number from this job's app id (as if the pending batch were there).
    csub.update_subscription(subscription={"name": s, "delta_config": {"table": b_t, "write_metadata": True}}, update_mask=["delta_config"])
    clock.advance(11)
    e3 = _exporter(csub, clock, tmp_path)
    pending = e3._pending.read(next(iter(_subs(csub))))
    assert pending is not None and pending.ack_ids
    # B records batch 4 only; make it record >= the pending batch, as the old code compared with:
    from deltalake import CommitProperties, Transaction, write_deltalake
    write_deltalake(b_t, landed(b_t).slice(0, 0), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(e3._app_id(next(iter(_subs(csub)))), pending.batch)]))
    for _ in range(3):
        e3.run(_subs(csub), 100)
    e3.close()
    got = landed(b_t)["message_id"].to_pylist() + (landed(a_t)["message_id"].to_pylist() if os.path.exists(a_t) else [])
    assert got.count(lost[0]) == 1  # before: acked without being appended anywhere (lost)
    assert csub.get_backlog(s).num_unacked_messages == 0


def test_an_export_batch_is_bounded_in_bytes_and_a_larger_message_goes_alone(pub, sub, topic, warehouse, tmp_path, monkeypatch):
    from deltabus.push import exporter

    monkeypatch.setattr(exporter, "EXPORT_BATCH_BYTES", 3_000)
    table = str(tmp_path / "bounded")
    s = sub.subscription_path("local", "export-bounded")
    sub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": table}})
    ids = pub.publish_batch(topic, [{"data": bytes([65 + i]) * 1_000} for i in range(7)] + [{"data": b"z" * 5_000}])
    job = DeliveryJob(None, config.Settings(warehouse=warehouse, **SETTINGS))  # type: ignore[arg-type]  # no pushes: no Spark
    try:
        run_until(job, lambda: sub.get_backlog(s).num_unacked_messages == 0)
    finally:
        job.close()
    dt = DeltaTable(table)
    assert sorted(landed(table)["data"].to_pylist()) == sorted([bytes([65 + i]) * 1_000 for i in range(7)] + [b"z" * 5_000])
    history = [h for h in dt.history() if h.get("operation") == "WRITE"]
    per_append = sorted(int(h["operationMetrics"]["num_added_rows"]) for h in history)
    assert sum(per_append) == len(ids) and max(per_append) <= 3  # 3 x 1,000 bytes at most; the 5,000-byte one alone
    assert 1 in per_append
