"""A subscription as a structured-streaming source (issue 17 part 1): format("deltabus").

Real SparkSession, real warehouses, sinks written with delta-rs through
``idempotent_delta_sink``. The SIGKILL test runs the query in child processes
(``_stream_worker.py``) killed at random points."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltabus import SubscriberClient
from deltabus.errors import InvalidArgument
from deltabus.spark.streaming import NAME, StreamOptions, idempotent_delta_sink, register
from tests import background
from tests.background import in_warehouse

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True, scope="module")
def _no_listener_left():
    """The shared SparkSession gets this source's listener here; later modules' queries must not."""
    yield
    from deltabus.spark.streaming import _LISTENED, unregister_listener

    for session in list(_LISTENED.keys()):
        unregister_listener(session)


def _stream(spark, warehouse, subscription, **options):
    register(spark)
    reader = spark.readStream.format(NAME).option("warehouse", warehouse).option("subscription", subscription)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def _sink_rows(uri: str) -> list[dict]:
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri).to_pyarrow_table().to_pylist()
    except TableNotFoundError:  # not there yet, or its first commit is being written
        return []


def _manifest_ids(parts) -> list[str]:
    """The message ids of a runtime's planned partitions (their manifest files)."""
    import pyarrow.parquet as pq

    return sorted(r["message_id"] for p in parts for r in pq.read_table(p.path).to_pylist())


def _run_until(query, done, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        if done():
            return True
        time.sleep(0.2)
    return False


def test_messages_flow_into_a_delta_sink_exactly_once_in_order_and_filtered(spark, pub, sub, topic, warehouse, tmp_path):
    s = sub.subscription_path("local", "stream")
    sub.create_subscription(request={"name": s, "topic": topic, "ack_deadline_seconds": 30, "enable_message_ordering": True,
                                     "filter": 'NOT attributes:drop'})
    published = pub.publish_batch(topic, [{"data": f"m{i}".encode(), "attributes": {"i": str(i)}} for i in range(250)])
    dropped = pub.publish_batch(topic, [{"data": b"d", "attributes": {"drop": "1"}}] * 40)
    published += pub.publish_batch(topic, [{"data": f"k{i}".encode(), "ordering_key": f"key{i % 3}"} for i in range(60)])
    sink = str(tmp_path / "sink")
    df = _stream(spark, warehouse, s, maxMessagesPerTrigger=100, rowsPerPartition=40)
    assert [f.name for f in df.schema] == ["message_id", "data", "attributes", "ordering_key", "publish_time", "delivery_attempt", "subscription"]
    write = idempotent_delta_sink(sink, "q1")

    def numbered(batch, batch_id):  # the batch id and the read order, to check ordering afterwards
        from pyspark.sql import functions as F

        write(batch.withColumn("batch", F.lit(batch_id)).withColumn("pos", F.monotonically_increasing_id()), batch_id)

    query = (df.writeStream.foreachBatch(numbered).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="0.1 seconds").start())
    try:
        assert _run_until(query, lambda: len(_sink_rows(sink)) >= len(published))
        more = pub.publish_batch(topic, [{"data": b"late"}] * 5)  # while it runs
        assert _run_until(query, lambda: len(_sink_rows(sink)) >= len(published) + 5)
        # Acked on commit: the backlog empties (the last batch's ack waits for an empty batch).
        assert _run_until(query, lambda: sub.get_backlog(s).num_unacked_messages == 0)
    finally:
        query.stop()
    rows = _sink_rows(sink)
    ids = [r["message_id"] for r in rows]
    assert sorted(ids) == sorted(published + more) and len(ids) == len(set(ids))  # every id exactly once
    assert not set(ids) & set(dropped)  # the filter holds: non-matching messages never reach a batch
    by_id = {r["message_id"]: r for r in rows}
    first = by_id[published[7]]
    assert first["data"] == b"m7" and dict(first["attributes"]) == {"i": "7"} and first["ordering_key"] == ""
    assert first["delivery_attempt"] == 1 and first["subscription"] == s and first["publish_time"] is not None
    # Ordering: within each key, publish order, inside each batch and across batches.
    keyed = sorted((r for r in rows if r["ordering_key"]), key=lambda r: (r["batch"], r["pos"]))
    for k in ("key0", "key1", "key2"):
        got = [r["data"] for r in keyed if r["ordering_key"] == k]
        assert sorted(got, key=lambda d: int(d[1:])) == got
    # The ledger keeps nothing once everything is acked (manifests are deleted).
    ledgers = list((Path(warehouse) / "_streams").glob("*/default"))
    assert len(ledgers) == 1 and not list(ledgers[0].glob("m-*/*.parquet"))  # at most the last empty batch's


def test_a_failed_batch_is_not_acked_and_its_messages_come_back(spark, pub, sub, topic, warehouse, tmp_path):
    s = sub.subscription_path("local", "failing")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=10)
    published = pub.publish_batch(topic, [{"data": f"x{i}".encode()} for i in range(30)])
    seen: list[tuple[int, list[str]]] = []

    def failing(df, batch_id):
        seen.append((batch_id, sorted(r["message_id"] for r in df.select("message_id").collect())))
        raise RuntimeError("sink down")

    ck = str(tmp_path / "ck")
    query = (_stream(spark, warehouse, s, leaseSeconds=10).writeStream.foreachBatch(failing).option("checkpointLocation", ck)
             .trigger(processingTime="0.1 seconds").start())
    deadline = time.time() + 60
    while query.isActive and time.time() < deadline:
        time.sleep(0.1)
    assert not query.isActive and query.exception() is not None
    assert seen and seen[0][1] == sorted(published)
    assert sub.get_backlog(s).num_unacked_messages == 30  # nothing acked
    # Restarted on the same checkpoint, the same batch id is replayed with the same rows.
    sink = str(tmp_path / "sink")
    write = idempotent_delta_sink(sink, "r")
    replayed: list[tuple[int, list[str]]] = []

    def recording(df, batch_id):
        replayed.append((batch_id, sorted(r["message_id"] for r in df.select("message_id").collect())))
        write(df, batch_id)

    query = (_stream(spark, warehouse, s, leaseSeconds=10).writeStream.foreachBatch(recording)
             .option("checkpointLocation", ck).trigger(processingTime="0.1 seconds").start())
    try:
        assert _run_until(query, lambda: len(_sink_rows(sink)) >= 30)
        assert _run_until(query, lambda: sub.get_backlog(s).num_unacked_messages == 0)
    finally:
        query.stop()
    assert replayed[0] == seen[0], (replayed[0][0], seen[0][0])  # same batch id, same rows
    ids = [r["message_id"] for r in _sink_rows(sink)]
    assert sorted(ids) == sorted(published)
    assert DeltaTable(sink).transaction_version("r") is not None
    # Not restarted: the leases lapse and a plain puller gets the messages again.
    s2 = sub.subscription_path("local", "failing2")
    sub.create_subscription(name=s2, topic=topic, ack_deadline_seconds=10)
    more = pub.publish_batch(topic, [{"data": b"y"}] * 5)
    query = (_stream(spark, warehouse, s2, leaseSeconds=10).writeStream.foreachBatch(failing)
             .option("checkpointLocation", str(tmp_path / "ck2")).trigger(processingTime="0.1 seconds").start())
    while query.isActive and time.time() < deadline + 60:
        time.sleep(0.1)
    got: list[str] = []
    until = time.time() + 30
    while time.time() < until and len(got) < 5:
        resp = sub.pull(subscription=s2, max_messages=10, timeout=2)
        got += [m.message.message_id for m in resp.received_messages]
        if resp.received_messages:
            sub.acknowledge(subscription=s2, ack_ids=[m.ack_id for m in resp.received_messages])
    assert sorted(got) == sorted(more)


def test_a_batch_failing_after_a_completed_one_is_nacked_by_the_listener(spark, pub, sub, topic, warehouse, tmp_path):
    """Leases of an hour: only the nack can hand the failed batch's messages back at once."""
    s = sub.subscription_path("local", "nacked")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=600)
    first = pub.publish_batch(topic, [{"data": b"ok"}] * 10)
    sink = str(tmp_path / "sink")
    write = idempotent_delta_sink(sink, "n")
    failed: list[str] = []

    def second_fails(df, batch_id):  # fails on the batch holding the "boom" messages
        rows = df.select("message_id", "data").collect()
        if not any(r["data"] == b"boom" for r in rows):
            write(df, batch_id)
            return
        failed.extend(r["message_id"] for r in rows)
        raise RuntimeError("sink down")

    query = (_stream(spark, warehouse, s, leaseSeconds=600).writeStream.foreachBatch(second_fails)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="0.1 seconds").start())
    assert _run_until(query, lambda: len(_sink_rows(sink)) == 10)
    later = pub.publish_batch(topic, [{"data": b"boom"}] * 5)
    deadline = time.time() + 60
    while query.isActive and time.time() < deadline:
        time.sleep(0.1)
    assert query.exception() is not None and sorted(failed) == sorted(later)
    got: list[str] = []
    until = time.time() + 30  # far less than the 600 s lease
    while time.time() < until and len(got) < 5:
        got += [m.message.message_id for m in sub.pull(subscription=s, max_messages=10, timeout=1).received_messages]
    assert sorted(got) == sorted(later)
    assert sorted(r["message_id"] for r in _sink_rows(sink)) == sorted(first)


@pytest.mark.parametrize(
    "options, field",
    [
        ({}, "warehouse"),
        ({"warehouse": "W"}, "subscription"),
        ({"warehouse": "W", "subscription": "nope"}, "subscription"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "maxmessagespertrigger": "lots"}, "maxMessagesPerTrigger"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "leaseSeconds": "5"}, "leaseSeconds"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "consumer": "a b"}, "consumer"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "pullWaitSeconds": "-1"}, "pullWaitSeconds"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "maxMesagesPerTrigger": "5"}, "maxMesagesPerTrigger"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "maxLeaseDuration": "5"}, "maxLeaseDuration"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "maxleaseduration": "nan"}, "maxLeaseDuration"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "rowsPerPartition": "0"}, "rowsPerPartition"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "rowsPerPartition": "nan"}, "rowsPerPartition"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "ownerTimeout": "1"}, "ownerTimeout"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "ownerTimeout": "NaN"}, "ownerTimeout"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "pullWaitSeconds": "nan"}, "pullWaitSeconds"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "leaseSeconds": "nan"}, "leaseSeconds"),
        ({"warehouse": "s3://b/w", "subscription": "projects/p/subscriptions/sss"}, "warehouse"),
        ({"warehouse": "W", "subscription": "projects/p/subscriptions/sss", "deliveryHistory": "maybe"}, "deliveryHistory"),
    ],
)
def test_bad_options_name_the_option_and_the_rule(options, field):
    with pytest.raises(InvalidArgument) as e:
        StreamOptions.from_options(options)
    assert e.value.field == field and e.value.rule
    if field == "maxMesagesPerTrigger":  # a misspelt option: named as spelled, with the one it resembles
        assert "did you mean maxMessagesPerTrigger?" in e.value.rule


def test_load_refuses_a_missing_subscription_with_a_clear_error(spark, pub, topic, warehouse):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    with pytest.raises((PySparkException, Py4JJavaError, Exception)) as e:
        _stream(spark, warehouse, "projects/local/subscriptions/missing")
    assert "missing" in str(e.value) and "NotFound" in str(e.value) or "not found" in str(e.value).lower()


def test_the_reader_and_its_partitions_pickle_and_open_nothing(tmp_path):
    from pyspark import cloudpickle

    from deltabus.spark.streaming import ManifestPart, SubscriptionStreamReader, _RUNTIMES

    opts = StreamOptions.from_options({"warehouse": str(tmp_path / "nowhere"), "subscription": "projects/p/subscriptions/sss"})
    reader = SubscriptionStreamReader(opts)
    again = cloudpickle.loads(cloudpickle.dumps(reader))
    assert again.opts == opts and not _RUNTIMES and not (tmp_path / "nowhere").exists()
    part = cloudpickle.loads(cloudpickle.dumps(ManifestPart("/x/part-00000.parquet", "projects/p/subscriptions/sss")))
    assert part.path == "/x/part-00000.parquet"


def _start_worker(warehouse, subscription, sink, checkpoint, log_path, *extra):
    env = {k: v for k, v in background.env().items() if not k.startswith("PYSPARK")}
    log = open(log_path, "a")
    return subprocess.Popen([sys.executable, str(HERE / "_stream_worker.py"), warehouse, subscription, sink, checkpoint, *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True)


def sigkill_at_random_points_and_restart_puts_every_id_in_the_sink_exactly_once(pub, topic, warehouse, tmp_path):
    """The query runs in a child process killed (SIGKILL of its whole process group: the JVM,
    the source's runner, the Python workers) at random moments while batches flow, twice, then
    runs to the end. Every published id is in the sink exactly once, each key in publish order."""
    sub = SubscriberClient(warehouse=warehouse)
    try:
        _sigkill_scenario(pub, sub, topic, warehouse, tmp_path)
    finally:
        sub.close()


def _sigkill_scenario(pub, sub, topic, warehouse, tmp_path):
    s = sub.subscription_path("local", "crashy")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=10, enable_message_ordering=True)
    published = pub.publish_batch(topic, [{"data": f"p{i}".encode()} for i in range(700)])
    published += pub.publish_batch(topic, [{"data": f"{i}".encode(), "ordering_key": f"key{i % 7}"} for i in range(700)])
    sink, ck, log_path = str(tmp_path / "sink"), str(tmp_path / "ck"), tmp_path / "worker.log"
    seed = int(os.environ.get("STREAM_CRASH_SEED") or time.time_ns())
    rng = random.Random(seed)
    replay = f"kill times from seed {seed}: replay with STREAM_CRASH_SEED={seed}"
    print(replay, flush=True)  # in the output of a failing run; and in every assertion message below
    with open(log_path, "a") as f:
        f.write(replay + "\n")
    for _ in range(2):
        worker = _start_worker(warehouse, s, sink, ck, log_path)
        try:
            before = len(_sink_rows(sink))
            deadline = time.time() + 120
            while time.time() < deadline and len(_sink_rows(sink)) == before and worker.poll() is None:
                time.sleep(0.05)  # until this run has written a batch: kill while batches flow
            assert worker.poll() is None, f"{replay}\n{log_path.read_text()[-3000:]}"
            # Somewhere in the next batches (pull, manifest, offset log, sink, ack), but while at
            # least two triggers' worth (250 each, the worker's) are left: a fast run had landed
            # every row before its second kill (CI, seed 1795775375137732542).
            until = time.time() + rng.uniform(0.0, 2.5)
            while time.time() < until and len(_sink_rows(sink)) < len(published) - 2 * 250:
                time.sleep(0.05)
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(30)
            with open(log_path, "a") as f:
                f.write(f"KILLED t={time.time():.1f}\n")
    assert 0 < len(_sink_rows(sink)) < len(published), replay
    worker = _start_worker(warehouse, s, sink, ck, log_path, "--until", str(len(published)))
    try:
        assert worker.wait(200) == 0, f"{replay}\n{log_path.read_text()[-3000:]}"
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    rows = _sink_rows(sink)
    ids = [r["message_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates; {replay}\n{log_path.read_text()[-3000:]}"
    assert set(ids) == set(published), f"{len(set(published) - set(ids))} lost; {replay}"  # none lost
    batches = {}
    for r in rows:
        batches.setdefault(r["message_id"], set()).add(r["batch"])
    assert all(len(b) == 1 for b in batches.values()), replay
    ordered = sorted((r for r in rows if r["ordering_key"]), key=lambda r: (r["batch"], r["pos"]))
    for k in range(7):
        got = [int(r["data"]) for r in ordered if r["ordering_key"] == f"key{k}"]
        assert got == sorted(got), replay
    assert sub.get_backlog(s).num_unacked_messages == 0, replay
    ledger = next((Path(warehouse) / "_streams").glob("*/default"))
    assert not list(ledger.glob("m-*/*.parquet")), replay  # no live manifest with rows left


# Three Spark starts in child processes (62-134 s here): in the background from the session's
# first test on (tests/background.py).
BACKGROUND = {"test_sigkill_at_random_points_and_restart_puts_every_id_in_the_sink_exactly_once":
              in_warehouse(sigkill_at_random_points_and_restart_puts_every_id_in_the_sink_exactly_once)}


def test_sigkill_at_random_points_and_restart_puts_every_id_in_the_sink_exactly_once(early_background):
    early_background.result("test_sigkill_at_random_points_and_restart_puts_every_id_in_the_sink_exactly_once")


def test_restart_orders_replay_the_same_rows_and_never_emit_a_message_twice(pub, sub, topic, warehouse):
    """The runner's calls in Spark's orders, without Spark (delta-rs warehouse): a crash after
    planning, the restart probe, a replay, leases lost meanwhile and re-pulled (absorbed, not
    emitted), an orphan offered again after a crash before Spark logged it."""
    import pyarrow.parquet as pq

    from deltabus.spark.streaming import _Runtime

    s = sub.subscription_path("local", "orders-of-calls")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=30)
    published = pub.publish_batch(topic, [{"data": f"r{i}".encode()} for i in range(40)])
    opts = StreamOptions.from_options({"warehouse": warehouse, "subscription": s, "maxMessagesPerTrigger": "25", "pullWaitSeconds": "0"})

    def rows(parts):
        return [r for p in parts for r in pq.read_table(p.path).to_pylist()]

    a = _Runtime(opts)
    one = a.latest()
    assert one["batch"] == 1 and a.latest() == one  # offered again until Spark plans it
    first = rows(a.partitions(a.offset(0), one))
    assert len(first) == 25
    a.stop()  # crash: batch 1 planned (in Spark's offset log), not committed
    # Its leases are lost meanwhile (nacked here instead of waiting for them to lapse).
    sub.modify_ack_deadline(subscription=s, ack_ids=[r["ack_id"] for r in first], ack_deadline_seconds=0)

    b = _Runtime(opts)
    assert b.partitions(one, one) == []  # Spark's restart probe
    assert rows(b.partitions(b.offset(0), one)) == first  # the replay reads the same rows
    two = b.latest()  # re-pulls the 25 nacked messages (absorbed) and leases the other 15
    second = rows(b.partitions(one, two))
    assert sorted(r["message_id"] for r in first + second) == sorted(published)  # each once
    b.commit(one)
    orphan_msgs = pub.publish_batch(topic, [{"data": b"o"}] * 3)
    three = b.latest()
    b.stop()  # crash before Spark logged batch 3: an orphan

    c = _Runtime(opts)
    assert c.partitions(two, two) == []
    assert c.latest() == three  # the orphan is offered as the next batch, not lost
    third = rows(c.partitions(two, three))
    assert sorted(r["message_id"] for r in third) == sorted(orphan_msgs)
    c.commit(two)
    # An ack that does not apply (the lease was lost and the message leased by someone else
    # meanwhile) leaves the message "unsettled": leased to this source again, it is acked, not emitted.
    sub.modify_ack_deadline(subscription=s, ack_ids=[r["ack_id"] for r in third], ack_deadline_seconds=0)
    other = sub.pull(subscription=s, max_messages=10, timeout=5).received_messages
    assert sorted(m.message.message_id for m in other) == sorted(orphan_msgs)
    four = c.latest()  # nothing to lease: an empty batch, so that Spark commits batch 3
    assert c.partitions(three, four) == [] and four["batch"] == 4  # planning 4 acks 3: it does not apply
    assert len(c.ledger.unsettled) == 3
    sub.modify_ack_deadline(subscription=s, ack_ids=[m.ack_id for m in other], ack_deadline_seconds=0)
    five = c.latest()  # pulls the 3 again: acked at once, not emitted, so nothing new
    assert five == four and not c.ledger.unsettled
    c.stop()
    assert sub.get_backlog(s).num_unacked_messages == 0


@pytest.mark.parametrize("recorded", [True, False])
def test_the_delivery_history_option_records_the_streams_leases_and_acks_or_nothing(pub, sub, topic, warehouse, recorded):
    from deltabus.delivery import history
    from deltabus.spark.streaming import _Runtime
    from deltabus.storage import open_engine

    s = sub.subscription_path("local", f"history-{str(recorded).lower()}")
    sub.create_subscription(name=s, topic=topic)
    published = pub.publish_batch(topic, [{"data": f"h{i}".encode()} for i in range(5)])
    opts = StreamOptions.from_options({"warehouse": warehouse, "subscription": s, "pullWaitSeconds": "0",
                                       "deliveryHistory": str(recorded).lower()})
    rt = _Runtime(opts)
    one = rt.latest()
    rt.partitions(rt.offset(0), one)
    rt.commit(one)
    rt.latest()  # planning the next batch acks the committed one
    rt.stop()
    assert sub.get_backlog(s).num_unacked_messages == 0
    rows = history.read(open_engine(warehouse, engine="delta-rs").snapshot("deliveries"), s)
    outcomes = sorted((r["message_id"], r["outcome"]) for r in rows.to_pylist())
    if recorded:
        assert outcomes == sorted([(m, "lease") for m in published] + [(m, "ack") for m in published])
    else:
        assert outcomes == []


def test_one_running_query_per_consumer_and_a_run_taken_over_stops(pub, sub, topic, warehouse):
    import json

    from deltabus.errors import FailedPrecondition
    from deltabus.spark.streaming import _Runtime

    s = sub.subscription_path("local", "owned")
    sub.create_subscription(name=s, topic=topic)
    opts = StreamOptions.from_options({"warehouse": warehouse, "subscription": s, "pullWaitSeconds": "0", "ownerTimeout": "3"})
    a = _Runtime(opts)
    owner = json.loads(Path(a._owner_path()).read_text())
    assert owner["run"] == a.run and owner["pid"] == os.getpid()
    started = time.time()
    with pytest.raises(FailedPrecondition, match="in use by another running query"):
        _Runtime(opts)  # a is alive and renews its heartbeat
    assert time.time() - started >= 3
    # Another run takes the ledger over (as after a's heartbeat stalled): a's next call fails.
    Path(a._owner_path()).write_text(json.dumps({"run": "other", "host": "elsewhere", "pid": 1, "heartbeat": time.time() + 60}))
    deadline = time.time() + 10
    while a.lost is None and time.time() < deadline:
        time.sleep(0.1)
    with pytest.raises(FailedPrecondition, match="taken over"):
        a.latest()
    a.stop()
    # A killed owner (its process gone) is taken over at once.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    Path(a._owner_path()).write_text(json.dumps({"run": "x", "host": __import__("socket").gethostname(), "pid": dead.pid,
                                                 "heartbeat": time.time()}))
    started = time.time()
    b = _Runtime(opts)
    assert time.time() - started < 2
    b.known = 0  # as Spark's initialOffset (before it, an idle latest makes an empty batch: policy.idle_offer)
    assert b.latest()["batch"] == 0
    b.stop()


def test_racing_acquirers_of_the_owner_lock_get_it_one_at_a_time(tmp_path):
    """Eight threads race for a free lock, then for a stale one (its process dead), then for a
    live one: exactly one wins each free round, none the live one, and the winner's doc is the
    file's."""
    import json
    import socket
    import threading

    from deltabus.spark.streaming import acquire_owner

    path = str(tmp_path / "owner.json")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def race(rounds_tag):
        barrier = threading.Barrier(8)
        won: list[str] = []

        def go(i):
            run = f"{rounds_tag}-{i}"
            doc = {"run": run, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time(), "since": time.time()}
            barrier.wait()
            if acquire_owner(path, doc, 3.0) is None:
                won.append(run)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return won

    for r in range(10):
        if os.path.exists(path):
            os.remove(path)
        won = race(f"free{r}")
        assert len(won) == 1 and json.loads(Path(path).read_text())["run"] == won[0]
        stale = {"run": f"dead{r}", "host": socket.gethostname(), "pid": dead.pid, "heartbeat": time.time(), "since": 0}
        Path(path).write_text(json.dumps(stale))
        won = race(f"stale{r}")
        assert len(won) == 1 and json.loads(Path(path).read_text())["run"] == won[0], won
        assert race(f"live{r}") == [] and json.loads(Path(path).read_text())["run"] == won[0]
    assert sorted(os.listdir(tmp_path)) == ["owner.json", "owner.json.lock"]  # no temporary file left


def test_a_new_checkpoint_on_the_same_consumer_gets_the_old_checkpoints_uncommitted_messages(pub, sub, topic, warehouse):
    import pyarrow.parquet as pq

    from deltabus.spark.streaming import _Runtime

    s = sub.subscription_path("local", "rechecked")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=60)
    published = pub.publish_batch(topic, [{"data": b"z"}] * 8)
    opts = StreamOptions.from_options({"warehouse": warehouse, "subscription": s, "pullWaitSeconds": "0"})
    old = _Runtime(opts)
    one = old.latest()
    assert len(old.partitions(old.offset(0), one)) == 1  # planned by the old checkpoint, never committed
    old.stop()
    new = _Runtime(opts)  # the checkpoint was deleted: Spark starts from the initial offset
    flush = new.latest()  # the 8 are still leased: nothing to pull, an empty batch
    assert new.partitions(new.offset(0), flush) == []  # a new lineage: batch 1 is abandoned, its leases handed back
    again = new.latest()
    got = [r["message_id"] for p in new.partitions(flush, again) for r in pq.read_table(p.path).to_pylist()]
    assert sorted(got) == sorted(published)
    new.stop()


def test_a_resumed_checkpoint_never_acks_another_checkpoints_uncommitted_batch(pub, sub, topic, warehouse):
    """Checkpoint X runs batches 1-2 and stops; checkpoint Y runs 3-4 on the same consumer and
    stops with 4 planned, not committed; X resumes. X's plans and commits must not ack Y's
    batch 4 (numbered below X's): its messages are handed back and reach X's next batch."""
    from deltabus.spark.streaming import _Runtime

    s = sub.subscription_path("local", "two-checkpoints")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=60)
    opts = StreamOptions.from_options({"warehouse": warehouse, "subscription": s, "pullWaitSeconds": "0"})

    x = _Runtime(opts)
    pub.publish_batch(topic, [{"data": b"1"}] * 3)
    one = x.latest()
    x.partitions(x.offset(0), one)
    pub.publish_batch(topic, [{"data": b"2"}] * 3)
    two = x.latest()
    x.partitions(one, two)  # Spark committed 1 (X's sink holds 1 and 2, say)
    x.stop()
    y = _Runtime(opts)  # another checkpoint on the same consumer
    pub.publish_batch(topic, [{"data": b"3"}] * 3)
    three = y.latest()
    y.partitions(y.offset(0), three)  # a new lineage: X's 2 is handed back
    pub.publish_batch(topic, [{"data": b"4"}] * 3)
    four = y.latest()
    in_four = _manifest_ids(y.partitions(three, four))
    y.stop()  # 4 planned by Y, never committed
    x = _Runtime(opts)
    assert x.partitions(two, two) == []  # X's restart probe
    pub.publish_batch(topic, [{"data": b"5"}] * 3)
    five = x.latest()
    x.partitions(two, five)
    x.commit(five)
    six = x.latest()  # Y's batch 4 was handed back, not acked: its messages come to X
    assert _manifest_ids(x.partitions(five, six)) == in_four and len(in_four) >= 3
    x.commit(six)
    x.stop()
    assert sub.get_backlog(s).num_unacked_messages == 0


def test_the_idempotent_sink_skips_a_replay_and_refuses_an_app_id_another_checkpoint_used(spark, tmp_path):
    from deltabus.errors import FailedPrecondition

    sink = str(tmp_path / "sink")
    write = idempotent_delta_sink(sink, "q")
    batch = lambda *ids: spark.createDataFrame([(i,) for i in ids], "message_id string")  # noqa: E731
    write(batch("a"), 0)
    write(batch("b"), 1)
    write(batch("b"), 1)  # Spark's replay of its last batch after a crash: skipped
    assert sorted(r["message_id"] for r in _sink_rows(sink)) == ["a", "b"]
    # A reset checkpoint starts again at batch 0 under the same app id: skipping it would
    # drop messages the source then acks, so it is refused, naming the app id.
    with pytest.raises(FailedPrecondition, match="app_id 'q'.*one app_id per checkpoint"):
        write(batch("c"), 0)
    assert sorted(r["message_id"] for r in _sink_rows(sink)) == ["a", "b"]


def test_available_now_order_never_offers_another_checkpoints_batch(pub, sub, topic, warehouse):
    """Trigger.AvailableNow calls latestOffset before initialOffset and the restart probe.
    Checkpoint X stops after batch 2; checkpoint Y leaves batch 4 planned, uncommitted; X
    resumes with AvailableNow and nothing new to read. Its first latestOffset must not offer
    Y's batch 4 (planning it from 2 was a LineageConflict): it makes an empty batch, whose
    plan commits X's 2 and hands Y's 4 back. Errors of plan name the consumer and subscription."""
    from deltabus.errors import FailedPrecondition
    from deltabus.spark.streaming import _Runtime

    s = sub.subscription_path("local", "available-now")
    sub.create_subscription(name=s, topic=topic, ack_deadline_seconds=60)
    opts = StreamOptions.from_options({"warehouse": warehouse, "subscription": s, "pullWaitSeconds": "0"})

    x = _Runtime(opts)
    pub.publish_batch(topic, [{"data": b"1"}] * 2)
    one = x.latest()
    x.partitions(x.offset(0), one)
    pub.publish_batch(topic, [{"data": b"2"}] * 2)
    two = x.latest()
    in_two = _manifest_ids(x.partitions(one, two))
    x.stop()
    y = _Runtime(opts)
    pub.publish_batch(topic, [{"data": b"3"}] * 2)
    three = y.latest()
    y.partitions(y.offset(0), three)
    pub.publish_batch(topic, [{"data": b"4"}] * 2)
    four = y.latest()
    in_four = _manifest_ids(y.partitions(three, four))
    y.stop()
    x = _Runtime(opts)
    target = x.latest()  # AvailableNow's first call: X's runtime does not know X is at 2
    assert target["batch"] not in (2, 4) and target["batch"] == x.ledger.next - 1
    assert x.partitions(two, two) == []  # the restart probe
    assert x.partitions(two, target) == []  # the empty batch; Y's 4 is handed back
    x.commit(target)
    five = x.latest()
    # Y's 4 holds its own 2 and X's batch 2 (which Y's new lineage handed back): all come to X now.
    assert _manifest_ids(x.partitions(target, five)) == in_four and len(in_four) == 4 and set(in_two) <= set(in_four)
    with pytest.raises(FailedPrecondition, match=r"consumer 'default' of .*available-now: batch 99 is not in the ledger"):
        x.partitions(five, x.offset(99))
    x.commit(five)
    x.stop()
    assert sub.get_backlog(s).num_unacked_messages == 0
