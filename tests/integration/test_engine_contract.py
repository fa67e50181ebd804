"""The storage contract, run against both engines.

The delta-rs half runs in the suite; the delta-spark half in the `cluster` group
(``./run-tests.sh -m cluster``; CI runs both), on that session's SparkSession, which has the
Delta jars (tests/conftest.py fetches them once into build/delta-jars). Only a machine that
can fetch no jars skips the delta-spark half, with conftest's reason (``requires_delta``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from deltabus import PublisherClient, SubscriberClient
from deltabus.storage import MatchedDelete, MatchedUpdate, NotMatchedInsert, open_engine
from deltabus.storage.arrow import plain, read_table
from deltabus.storage.clock import StorageClock
from deltabus.storage.commit_files import inserted_files
from deltabus.storage.tables import ALL, DELIVERIES, TS
from tests.conftest import delivery_state, requires_delta

# In the suite, its tests run in a pytest process of their own beside the session's others
# (tests/background.py); in the cluster group (its delta-spark half) they run in place.
OUT_OF_PROCESS = True


@pytest.fixture(scope="session")
def delta_spark_tables(spark, tmp_path_factory) -> Path:
    """A warehouse whose tables delta-spark created (ensure_tables on the delta-spark engine),
    made once per run: creating six tables through Spark costs seconds, so each test gets a
    copy (``delta_spark_warehouse``) rather than creating its own."""
    requires_delta(spark)
    template = tmp_path_factory.mktemp("delta-spark-template") / "warehouse"
    open_engine(str(template), engine="delta-spark", spark=spark)
    return template


def delta_spark_warehouse(template: Path, warehouse: str) -> str:
    """A fresh copy of the delta-spark-created tables at `warehouse` (a copied Delta table is
    the same table: its log names files relative to the table's directory)."""
    shutil.copytree(template, warehouse)
    return warehouse


# The delta-spark half is in the `cluster` group with the other slow delta-spark runs
# (./run-tests.sh -m cluster; CI runs both), in place on that session's warm SparkSession. In
# the suite, in a pytest process of its own, it took 128 s of the 911 s on a fresh clone
# (2026-11-27), a third of it starting and warming a JVM with Delta.
@pytest.fixture(params=["delta-rs", pytest.param("delta-spark", marks=pytest.mark.cluster)])
def engine(request, warehouse):
    if request.param == "delta-spark":
        spark = request.getfixturevalue("spark")
        requires_delta(spark)
        delta_spark_warehouse(request.getfixturevalue("delta_spark_tables"), warehouse)
        return open_engine(warehouse, engine="delta-spark", spark=spark)
    return open_engine(warehouse, engine="delta-rs")


@pytest.fixture
def other(engine, warehouse):
    """A second writer on the same warehouse and engine, as another process would be."""
    return open_engine(warehouse, engine=engine.name, spark=getattr(engine, "spark", None))


def rows(sub_uid: str, ids: list[str], attempt: int = 0) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "sub_uid": [sub_uid] * n,
            "message_id": ids,
            "message_version": pa.array([1] * n, pa.int64()),
            "publish_time": pa.array([1_700_000_000_000_000] * n, TS),
            "ordering_key": [""] * n,
            "size_bytes": pa.array([10] * n, pa.int64()),
            "delivery_attempt": pa.array([attempt] * n, pa.int32()),
            "lease_expires": pa.nulls(n, TS),
            "dead_letter_key": pa.nulls(n, pa.int64()),  # deliveries schema version 2 (issue 13)
            **{f.name: pa.nulls(n, f.type) for f in DELIVERIES.layers[2]},  # version 3: the delivery history (issue 17)
        },
        schema=DELIVERIES.schema,
    )


INSERT = [NotMatchedInsert({c: f"s.{c}" for c in DELIVERIES.schema.names})]
OPS = [
    MatchedDelete(when="s.delivery_attempt = -1"),
    MatchedUpdate({"delivery_attempt": "t.delivery_attempt + 1"}, when="s.delivery_attempt >= 0"),
    *INSERT,
]


def on(uid: str) -> str:
    return f"t.sub_uid = '{uid}' AND t.sub_uid = s.sub_uid AND t.message_id = s.message_id"


def state(engine, uid: str) -> list[tuple[str, int]]:
    table = engine.snapshot("deliveries").read(columns=["message_id", "delivery_attempt"], partition=uid)
    return sorted(zip(table["message_id"].to_pylist(), table["delivery_attempt"].to_pylist()))


def test_tables_have_the_declared_layout_readable_by_delta_rs(engine, warehouse):
    for spec in ALL:
        dt = DeltaTable(engine.table_uri(spec.name))
        assert [f.name for f in pa.schema(dt.schema().to_arrow())] == spec.schema.names, spec.name
        assert dt.metadata().partition_columns == list(spec.partition_by), spec.name
        for key, value in spec.configuration.items():
            assert dt.metadata().configuration.get(key) == value, (spec.name, key)
    before = {spec.name: DeltaTable(engine.table_uri(spec.name)).version() for spec in ALL}
    engine.ensure_tables()  # idempotent: writes nothing the second time
    assert {spec.name: DeltaTable(engine.table_uri(spec.name)).version() for spec in ALL} == before


def test_merge_inserts_updates_deletes_and_records_every_app_transaction(engine):
    snap = engine.snapshot("deliveries")
    snap.merge(rows("sa", ["1", "2", "3"]), on("sa"), OPS, app_txn=[("cursor-sa", 7), ("job", 1)])
    after = engine.snapshot("deliveries")
    assert after.txn_version("cursor-sa") == 7
    assert after.txn_version("job") == 1
    assert after.txn_version("never") is None
    assert state(engine, "sa") == [("1", 0), ("2", 0), ("3", 0)]
    change = pa.concat_tables([rows("sa", ["1"], attempt=0), rows("sa", ["2"], attempt=-1), rows("sa", ["4"])])
    engine.snapshot("deliveries").merge(change, on("sa"), OPS, app_txn=("job", 2))
    assert state(engine, "sa") == [("1", 1), ("3", 0), ("4", 0)]
    assert engine.snapshot("deliveries").txn_version("job") == 2


def test_read_filters_by_partition_expression_and_pruning_predicate(engine):
    both = pa.concat_tables([rows("sa", ["1", "2"]), rows("sa", ["3"], attempt=1)])
    engine.snapshot("deliveries").merge(both, on("sa"), INSERT)
    engine.snapshot("deliveries").merge(rows("sb", ["1"]), on("sb"), INSERT)
    snap = engine.snapshot("deliveries")
    assert snap.read(partition="sb").num_rows == 1
    got = snap.read(columns=["message_id"], partition="sa", filter=pc.field("delivery_attempt") == 0, prune="message_id >= '2'")
    # prune may skip files that cannot match (it need not drop rows); filter drops rows.
    assert "2" in got["message_id"].to_pylist() and "3" not in got["message_id"].to_pylist()
    assert got.schema.types == [pa.string()]
    full = snap.read(partition="sa")
    assert full.schema.types == DELIVERIES.schema.types  # plain Arrow types whatever the engine


def test_a_write_on_a_stale_snapshot_of_the_same_partition_conflicts(engine, other):
    engine.snapshot("deliveries").merge(rows("sa", ["1", "2"]), on("sa"), INSERT)
    stale = engine.snapshot("deliveries")
    other.snapshot("deliveries").merge(rows("sa", ["1"]), on("sa"), OPS)
    with pytest.raises(engine.conflict_errors):
        stale.merge(rows("sa", ["2"]), on("sa"), OPS)
    assert state(engine, "sa") == [("1", 1), ("2", 0)]


def test_writes_to_other_partitions_do_not_conflict(engine, other):
    engine.snapshot("deliveries").merge(rows("sa", ["1"]), on("sa"), INSERT)
    a = engine.snapshot("deliveries")
    other.snapshot("deliveries").merge(rows("sb", ["1"]), on("sb"), INSERT)
    a.merge(rows("sa", ["1"]), on("sa"), OPS)
    assert state(engine, "sa") == [("1", 1)]
    assert state(engine, "sb") == [("1", 0)]


def test_history_rows_of_two_subscriptions_on_one_day_do_not_conflict(engine, other):
    """The delivery history (issue 17): each MERGE inserts its history rows into the same day
    partition, and neither conflicts with the other (delta-spark: the insert-only partition is
    left out of the snapshot check; both: the MERGE condition pins only the subscription)."""
    from deltabus.delivery import history, merge
    from deltabus.delivery.model import Op

    engine.snapshot("deliveries").merge(rows("sa", ["1"]), on("sa"), INSERT)
    other.snapshot("deliveries").merge(rows("sb", ["1"]), on("sb"), INSERT)
    now_us = int(time.time() * 1e6)

    def leased(uid: str, name: str) -> list[pa.Table]:
        one = pa.table({"message_id": ["1"]})
        lease = merge.source_rows(Op.LEASE, uid, one, pa.array([1], pa.int32()), pa.array([now_us + 60_000_000], TS))
        return [lease, history.rows(history.RECORD, name, one["message_id"], pa.array([1], pa.int32()), "lease", now_us)]

    stale = engine.snapshot("deliveries")
    merge.commit(other.snapshot("deliveries"), leased("sb", "sub-b"), ["sb"])  # history into today's partition first
    merge.commit(stale, leased("sa", "sub-a"), ["sa"])  # on a snapshot from before it: still commits
    assert state(engine, "sa") == [("1", 1)] and state(engine, "sb") == [("1", 1)]
    got = history.read(engine.snapshot("deliveries"))
    assert sorted(zip(got["subscription"].to_pylist(), got["message_id"].to_pylist(), got["outcome"].to_pylist())) == [
        ("sub-a", "1", "lease"), ("sub-b", "1", "lease")]


def test_transact_reruns_conflicting_work_on_a_fresh_snapshot(engine, other):
    engine.snapshot("deliveries").merge(rows("sa", ["1"]), on("sa"), INSERT)
    calls = []

    def bump(snap):
        calls.append(snap.version)
        if len(calls) == 1:  # a concurrent writer commits between our read and our write
            other.snapshot("deliveries").merge(rows("sa", ["1"]), on("sa"), OPS)
        snap.merge(rows("sa", ["1"]), on("sa"), OPS)
        return len(calls)

    assert engine.transact("deliveries", bump, what="bump") == 2
    assert calls[1] > calls[0]
    assert state(engine, "sa") == [("1", 2)]  # both increments, none lost


def test_commit_txns_alone_and_append_and_overwrite_and_delete(engine):
    engine.snapshot("deliveries").commit_txns([("cursor-x", 3)])
    assert engine.snapshot("deliveries").txn_version("cursor-x") == 3
    engine.append("deliveries", rows("sa", ["1", "2"]))
    engine.snapshot("deliveries").delete("sub_uid = 'sa' AND message_id = '1'")
    assert state(engine, "sa") == [("2", 0)]
    engine.snapshot("deliveries").overwrite(rows("sc", ["9"]))
    assert engine.snapshot("deliveries").read()["sub_uid"].to_pylist() == ["sc"]
    assert engine.snapshot("deliveries").txn_version("cursor-x") == 3  # app transactions survive


def test_change_feed_returns_inserted_rows_with_their_versions(engine):
    engine.append("deliveries", rows("sa", ["1"]))
    first = engine.version("deliveries")
    engine.append("deliveries", rows("sb", ["2"]))
    engine.append("deliveries", rows("sa", ["3"]))
    last = engine.version("deliveries")
    # deliveries has no change feed; messages does: publish through the engine's own appends instead.
    msgs = pa.table(
        {
            "topic_uid": ["t1", "t2"],
            "topic": ["a", "b"],
            "message_id": ["m1", "m2"],
            "data": [b"x", b"y"],
            "attributes": pa.array([[], []], pa.map_(pa.string(), pa.string())),
            "ordering_key": ["", ""],
            "publish_time": pa.array([1, 2], TS),
            "size_bytes": pa.array([1, 1], pa.int64()),
        }
    )
    start = engine.version("messages") + 1
    engine.append("messages", msgs.slice(0, 1))
    engine.append("messages", msgs.slice(1, 1))
    end = engine.version("messages")
    got = engine.snapshot("messages").changes(start, end, ["message_id"], partition="t2")
    assert got["message_id"].to_pylist() == ["m2"]
    assert got["_commit_version"].to_pylist() == [end]
    assert got.schema.field("_commit_version").type == pa.int64()
    assert last > first


def _feed_inserts(uri: str, start: int, end: int, partition: str | None) -> list[tuple[str, int]]:
    """delta-rs's own change feed: the reference the engine's change reads must match."""
    t = plain(DeltaTable(uri).load_cdf(starting_version=start, ending_version=end,
                                       columns=["topic_uid", "message_id", "_change_type", "_commit_version"]))
    t = t.filter(pc.equal(t["_change_type"], "insert"))
    if partition is not None:
        t = t.filter(pc.equal(t["topic_uid"].cast(pa.string()), partition))
    return sorted(zip(t["message_id"].cast(pa.string()).to_pylist(), t["_commit_version"].cast(pa.int64()).to_pylist()))


def test_change_reads_match_the_change_feed_across_appends_compaction_and_a_delete(engine):
    """The change reads (delta-rs reads the commit files of versions that only added files,
    storage/commit_files.py; the change feed otherwise) give exactly the change feed's
    inserts, with their versions and the partition column, over every range of a history
    with appends to two partitions, a compaction (no new rows) and a delete (change-data
    files: the change feed)."""

    def msgs(topic: str, ids: list[str]) -> pa.Table:
        n = len(ids)
        return pa.table({
            "topic_uid": [topic] * n, "topic": [topic] * n, "message_id": ids, "data": [b"x"] * n,
            "attributes": pa.array([[("k", i)] for i in ids], pa.map_(pa.string(), pa.string())),
            "ordering_key": [""] * n, "publish_time": pa.array(range(n), TS), "size_bytes": pa.array([1] * n, pa.int64()),
        })

    first = engine.version("messages") + 1
    for i in range(4):
        engine.append("messages", pa.concat_tables([msgs("t1", [f"a{i}-{k}" for k in range(3)]), msgs("t2", [f"b{i}"])]))
    uri = engine.table_uri("messages")
    DeltaTable(uri).optimize.compact(partition_filters=[("topic_uid", "=", "t1")])  # dataChange false: no new rows
    engine.append("messages", msgs("t1", ["c0", "c1"]))
    engine.transact("messages", lambda snap: snap.delete("message_id = 'a0-1'"), what="delete one")  # a rewrite with cdc files
    engine.append("messages", msgs("t2", ["d0"]))
    last = engine.version("messages")
    assert last - first >= 7
    log_dir = f"{uri}/_delta_log"
    assert inserted_files(log_dir, first, first + 3, "topic_uid", "t1") is not None  # appends: the commit files are read
    assert inserted_files(log_dir, last - 1, last - 1, "topic_uid", None) is None  # the delete: the change feed
    for a in range(first, last + 1):
        for b in range(a, last + 1):
            for part in ("t1", "t2", None):
                got = engine.snapshot("messages").changes(a, b, ["message_id", "topic_uid", "attributes"], partition=part)
                pairs = sorted(zip(got["message_id"].to_pylist(), got["_commit_version"].to_pylist()))
                assert pairs == _feed_inserts(uri, a, b, part), (a, b, part)
                assert got.schema.field("_commit_version").type == pa.int64()
                assert got.schema.field("message_id").type == pa.string()
                assert all(t == dict(attrs)["k"] for t, attrs in zip(got["message_id"].to_pylist(), got["attributes"].to_pylist()))
                if part is not None:
                    assert set(got["topic_uid"].to_pylist()) <= {part}
                else:
                    assert all((t == "t1") == (m[0] in "ac") for t, m in zip(got["topic_uid"].to_pylist(), got["message_id"].to_pylist()))


def test_change_reads_of_appends_skip_the_change_feed_and_carry_every_column(engine, monkeypatch):
    """Versions that only appended are read from their commit files (storage/commit_files.py:
    delta-rs's load_cdf costs in proportion to the versions after the read's start), and
    every column comes back as the change feed gives it."""
    pub = PublisherClient(engine=engine)
    topic = pub.topic_path("p", "cols")
    pub.create_topic(name=topic)
    first = engine.version("messages") + 1
    for i in range(3):
        pub.publish_batch(topic, [{"data": f"{i}-{k}".encode(), "attributes": {"k": str(k)}, "ordering_key": "ok" if k % 2 else ""}
                                  for k in range(4)])
    last = engine.version("messages")
    columns = ["topic_uid", "message_id", "data", "attributes", "ordering_key", "publish_time", "size_bytes"]
    feed = plain(DeltaTable(engine.table_uri("messages")).load_cdf(starting_version=first, ending_version=last,
                                                                   columns=[*columns, "_change_type", "_commit_version"]))
    feed = feed.filter(pc.equal(feed["_change_type"], "insert")).select([*columns, "_commit_version"])
    feed = feed.set_column(len(columns), "_commit_version", pc.cast(feed["_commit_version"], pa.int64()))

    def refused(*args, **kwargs):
        raise AssertionError("load_cdf was called for versions that only appended")

    monkeypatch.setattr(DeltaTable, "load_cdf", refused)
    got = engine.snapshot("messages").changes(first, last, columns)
    assert got.num_rows == feed.num_rows == 12
    assert got.sort_by("message_id").to_pylist() == feed.sort_by("message_id").to_pylist()


def test_pull_and_ack_through_the_clients_on_this_engine(engine, warehouse):
    pub = PublisherClient(engine=engine)
    sub = SubscriberClient(engine=engine)
    topic = pub.topic_path("proj", "orders")
    name = sub.subscription_path("proj", "orders-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=name, topic=topic)
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}, {"data": b"c"}])
    pub.publish(topic, b"d").result()
    got = sub.pull(subscription=name, max_messages=100).received_messages
    assert sorted(m.message.data for m in got) == [b"a", b"b", b"c", b"d"]
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
    assert sub.pull(subscription=name, max_messages=100, return_immediately=True).received_messages == []
    # What this engine wrote, the other reader reads.
    assert delivery_state(read_table(engine.table_uri("deliveries"))).num_rows == 0
    assert read_table(engine.table_uri("messages")).num_rows == len(got)
    pub.stop()
    sub.close()


def test_a_storage_clock_on_this_engine_keeps_storage_time(engine):
    """Issue 16: a clock 30 s ahead, attached to the engine, reads the storage's time within
    its error bars. delta-rs reports its commits' log stamps; delta-spark reports none (its
    commits happen in the JVM), so its clock lives on probes of the warehouse folder."""
    clock = StorageClock(lambda: time.time() + 30)
    clock.attach(engine)
    t0 = time.time()
    earliest, latest = clock(), clock.latest()
    assert t0 - 0.05 <= earliest <= latest <= time.time() + 0.05
    seen = clock.describe()["observations"]
    engine.append(DELIVERIES.name, rows("s-clock", ["m-1"]))
    assert clock.describe()["observations"] == seen + (1 if engine.name == "delta-rs" else 0)
    assert clock.probes == 1


def test_a_lease_decided_on_an_attempt_that_moved_on_is_not_granted(engine):
    """The lease clause is a compare-and-set on delivery_attempt: two writers that decided to
    lease one row from the same state cannot both hold it, whichever engine commits them,
    even where no conflict check saw the first (delta-spark's window before its MERGE reads)."""
    from deltabus.delivery.merge import commit, source_rows
    from deltabus.delivery.model import Op
    from deltabus.storage.engine import WriteRaced

    uid = "sl"
    engine.snapshot("deliveries").merge(rows(uid, ["m1", "m2"]), on(uid), INSERT)
    decided = rows(uid, ["m1"])  # both writers saw m1 at attempt 0
    first = pa.array([1_800_000_000_000_000], TS)
    second = pa.array([1_900_000_000_000_000], TS)
    commit(engine.snapshot("deliveries"), [source_rows(Op.LEASE, uid, decided, pa.array([1], pa.int32()), first)], [uid])
    # The second writer's decision, committed on a fresh snapshot as if no check had caught it:
    # the row is refused, and the writer learns it (a conflict, so its pull reruns).
    with pytest.raises(WriteRaced, match="num_target_rows_updated 0 < 1"):
        commit(engine.snapshot("deliveries"), [source_rows(Op.LEASE, uid, decided, pa.array([1], pa.int32()), second)], [uid])
    got = engine.snapshot("deliveries").read(columns=["message_id", "delivery_attempt", "lease_expires"], partition=uid)
    by_id = {r["message_id"]: r for r in got.to_pylist()}
    assert by_id["m1"]["delivery_attempt"] == 1
    assert by_id["m1"]["lease_expires"] == first.to_pylist()[0]  # the first lease stands
    assert by_id["m2"]["delivery_attempt"] == 0 and by_id["m2"]["lease_expires"] is None


def test_the_leases_of_a_raced_decision_that_did_apply_are_found(engine):
    """A decision of which only some leases applied (another writer leased the rest after its
    snapshot) is committed all the same: ``applied_leases`` names the ones it holds, so a pull
    hands those out rather than leaving them to expire unused, and never the refused ones."""
    from deltabus.delivery.merge import LeasesRaced, applied_leases, commit, source_rows
    from deltabus.delivery.model import Op

    uid = "sr"
    engine.snapshot("deliveries").merge(rows(uid, ["m1", "m2", "m3"]), on(uid), INSERT)
    theirs = pa.array([1_800_000_000_000_000], TS)
    commit(engine.snapshot("deliveries"), [source_rows(Op.LEASE, uid, rows(uid, ["m2"]), pa.array([1], pa.int32()), theirs)], [uid])
    mine = pa.array([1_900_000_000_000_000] * 3, TS)
    decided = source_rows(Op.LEASE, uid, rows(uid, ["m1", "m2", "m3"]), pa.array([1, 1, 1], pa.int32()), mine)
    with pytest.raises(LeasesRaced, match="num_target_rows_updated 2 < 3") as raced:
        commit(engine.snapshot("deliveries"), [decided], [uid])
    assert applied_leases(engine.snapshot("deliveries"), raced.value) == {(uid, "m1"), (uid, "m3")}
    # A lease counted on an attempt that moved on again (acked, or leased anew) is not ours either.
    commit(engine.snapshot("deliveries"), [source_rows(Op.ACK, uid, rows(uid, ["m3"]), pa.array([1], pa.int32()), pa.nulls(1, TS))], [uid])
    assert applied_leases(engine.snapshot("deliveries"), raced.value) == {(uid, "m1")}


def test_a_refused_lease_is_not_hidden_by_an_outcome_that_applied(engine):
    """Each kind of row is counted on its own: a refused lease beside a nack that applied (both
    updates) still makes the commit fall short, so the refused lease is never handed out, and
    neither is the lease of a new message whose insert found the row already there."""
    from deltabus.delivery.merge import NACKED_US, LeasesRaced, applied_leases, commit, source_rows
    from deltabus.delivery.model import Op

    uid = "sn"
    engine.snapshot("deliveries").merge(rows(uid, ["m1", "m2", "m3"]), on(uid), INSERT)
    ts = lambda us: pa.array([us], TS)  # noqa: E731
    one = pa.array([1], pa.int32())
    commit(engine.snapshot("deliveries"), [source_rows(Op.LEASE, uid, rows(uid, ["m3"]), one, ts(1_700_000_000_000_000))], [uid])
    commit(engine.snapshot("deliveries"), [source_rows(Op.LEASE, uid, rows(uid, ["m2"]), one, ts(1_800_000_000_000_000))], [uid])
    mine = 1_900_000_000_000_000
    decided = [
        source_rows(Op.LEASE, uid, rows(uid, ["m1", "m2"]), pa.array([1, 1], pa.int32()), pa.array([mine, mine], TS)),
        source_rows(Op.NACK, uid, rows(uid, ["m3"]), one, ts(NACKED_US)),  # applies: the count of updates stays 2
        source_rows(Op.INSERT, uid, rows(uid, ["m4"]), one, ts(mine)),  # a new message, leased as it is fanned out
    ]
    with pytest.raises(LeasesRaced, match="num_target_rows_updated 2 < 3") as raced:
        commit(engine.snapshot("deliveries"), decided, [uid])
    assert applied_leases(engine.snapshot("deliveries"), raced.value) == {(uid, "m1"), (uid, "m4")}
    # Another writer fanned m5 out first: our insert of it is skipped, and its lease is not ours.
    engine.snapshot("deliveries").merge(rows(uid, ["m5"]), on(uid), INSERT)
    with pytest.raises(LeasesRaced, match="num_target_rows_inserted 0 < 1") as raced:
        commit(engine.snapshot("deliveries"), [source_rows(Op.INSERT, uid, rows(uid, ["m5"]), one, ts(mine))], [uid])
    assert applied_leases(engine.snapshot("deliveries"), raced.value) == frozenset()


def test_merge_counts_carry_one_set_of_names_and_registry_updates_find_their_rows(engine):
    """Callers count acks, deadline changes and registry updates by the MERGE's counts: every
    engine names them alike. (Under delta-spark's own names an update counted 0, and
    modify_push_config and delete_subscription said the subscription did not exist.)"""
    from deltabus.errors import NotFound

    m = engine.snapshot("deliveries").merge(rows("sc", ["1", "2", "3"]), on("sc"), INSERT)
    assert m["num_target_rows_inserted"] == 3
    change = pa.concat_tables([rows("sc", ["1"], attempt=0), rows("sc", ["2"], attempt=-1), rows("sc", ["4"])])
    m = engine.snapshot("deliveries").merge(change, on("sc"), OPS)
    assert (m["num_target_rows_updated"], m["num_target_rows_deleted"], m["num_target_rows_inserted"]) == (1, 1, 1)
    pub, sub = PublisherClient(engine=engine), SubscriberClient(engine=engine)
    topic = pub.create_topic(name=pub.topic_path("proj", "counted")).name
    name = sub.subscription_path("proj", "counted-sub")
    sub.create_subscription(name=name, topic=topic)
    sub.modify_push_config(subscription=name, push_config={"push_endpoint": "https://example.invalid/push"})
    assert sub.get_subscription(subscription=name).push_config.push_endpoint == "https://example.invalid/push"
    sub.delete_subscription(subscription=name)
    with pytest.raises(NotFound):
        sub.get_subscription(subscription=name)
    pub.stop()
    sub.close()


def test_new_messages_alone_commit_as_an_append_that_one_of_two_fan_outs_wins(engine, other):
    """merge.commit writes INSERT-only source rows (newly fanned-out messages) with the
    cursor's app transaction as a blind append on delta-rs (a MERGE on delta-spark, whose
    append does not commit on the snapshot it was decided on): the same rows a MERGE would
    insert, in one commit, and a second writer that fanned out the same versions conflicts."""
    from deltabus.delivery.merge import commit, source_rows
    from deltabus.delivery.model import Op

    uid = "sn"
    new = rows(uid, ["m2", "m1"])
    lease = pa.array([1_800_000_000_000_000, None], TS)
    part = source_rows(Op.INSERT, uid, new, pa.array([1, 0], pa.int32()), lease)
    stale = other.snapshot("deliveries")
    before = engine.snapshot("deliveries").version
    m = commit(engine.snapshot("deliveries"), [part], [uid], [("cursor-sn", 7)])
    assert m.get("num_target_rows_inserted") == 2
    assert engine.snapshot("deliveries").version == before + 1
    ops = [h.get("operation") for h in DeltaTable(engine.table_uri("deliveries")).history(1)]
    assert ops == (["WRITE"] if engine.name == "delta-rs" else ["MERGE"])
    got = engine.snapshot("deliveries").read(columns=["message_id", "delivery_attempt", "lease_expires"], partition=uid)
    assert sorted(got.to_pylist(), key=lambda r: r["message_id"]) == [
        {"message_id": "m1", "delivery_attempt": 0, "lease_expires": None},
        {"message_id": "m2", "delivery_attempt": 1, "lease_expires": lease.to_pylist()[0]},
    ]
    if engine.name == "delta-rs":
        assert got["message_id"].to_pylist() == ["m1", "m2"]  # the append writes message-id order, as a MERGE
    assert engine.snapshot("deliveries").txn_version("cursor-sn") == 7
    with pytest.raises(engine.conflict_errors):  # the same fan-out decided on the older snapshot
        commit(stale, [part], [uid], [("cursor-sn", 7)])
    assert state(engine, uid) == [("m1", 0), ("m2", 1)]  # nothing inserted twice


def test_new_messages_whose_rows_exist_past_the_cursor_are_not_inserted_twice(engine):
    """A crash between a push batch's MERGE and its cursor's commit leaves rows past the
    cursor: the next fan-out's INSERT rows for them must not duplicate them (a MERGE, not an
    append, then), whatever the engine."""
    from deltabus.delivery.merge import commit, source_rows
    from deltabus.delivery.model import Op

    uid = "sp"
    engine.snapshot("deliveries").merge(rows(uid, ["m1"]), on(uid), INSERT)  # m1 there, the cursor not moved
    part = source_rows(Op.INSERT, uid, rows(uid, ["m1", "m2"]), pa.array([0, 0], pa.int32()), pa.nulls(2, TS))
    commit(engine.snapshot("deliveries"), [part], [uid], [("cursor-sp", 3)])
    assert state(engine, uid) == [("m1", 0), ("m2", 0)]
    assert engine.snapshot("deliveries").txn_version("cursor-sp") == 3
