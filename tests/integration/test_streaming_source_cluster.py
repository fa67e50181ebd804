"""The deltabus stream source (issue 17 part 1) on the delta-spark engine, on a standalone cluster.

The query's driver is a ``./spark-submit.sh --master spark://… --engine delta-spark`` job
(``_stream_cluster_worker.py``), as users run it: the warehouse is created through the
delta-spark engine, the topic and a subscription with a filter and ordering keys too, and the
first messages are published through it; more are published through delta-rs meanwhile, as
in a warehouse both engines use. The query reads ``format("deltabus")`` (the manifests are
read by the executors of a two-worker standalone cluster) into delta-spark's own sink,
``writeStream.format("delta")`` with a checkpoint (idempotent by query id and batch id).
The driver and everything under it is killed with SIGKILL at a random point while batches
flow, then restarted on the same checkpoint: every id that passes the filter is in the sink
exactly once, each key in publish order, and the subscription's backlog is empty.

Its own small cluster (two workers of one core: 7 s to start here under load) rather than
test_cluster's: that one is module-scoped, and its last test leaves it with one worker.
Measured here on 2 cores: 90-145 s in all, most of it the delta-spark set-up (20-48 s, cold
JVM) and each driver's first batch (10-25 s); the other batches take 1.5-3 s.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from deltabus.spark.standalone import ClusterSettings, StandaloneCluster, kill_tree
from tests.conftest import DELTA_SKIP, ROOT
from tests.integration import _stream_cluster_worker as worker

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.spark,
    pytest.mark.timeout(600),
    pytest.mark.skipif(DELTA_SKIP is not None, reason=str(DELTA_SKIP)),
]

WORKERS = 2
CORES = 1  # two task slots: the stream's tasks are small; two executors show the manifests read on both
CONFS = [
    "--conf", f"spark.cores.max={WORKERS * CORES}",
    "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",  # both executors before the first batch
    "--conf", "spark.executor.memory=512m",
    # Executors of a minute: C1 only and the serial collector, as the driver has them from
    # conf/spark-defaults.conf (C2's compiles cost more CPU than they win back that soon).
    "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "--conf", "spark.driver.memory=1g",
    "--conf", "spark.ui.enabled=false",
    "--conf", "spark.executorEnv.DELTABUS_ENGINE=delta-spark",
    "--conf", f"spark.sql.shuffle.partitions={WORKERS * CORES}",
    "--conf", f"spark.databricks.delta.snapshotPartitions={WORKERS * CORES}",
]
WORKER = ROOT / "tests" / "integration" / "_stream_cluster_worker.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with StandaloneCluster(
        ClusterSettings(workers=WORKERS, cores=CORES, memory="1g"),
        base_dir=tmp_path_factory.mktemp("stream-cluster"), env=os.environ, conf_dir=ROOT / "conf",
    ) as c:
        yield c
    assert c.pids() == []


def start(cluster: StandaloneCluster, cwd: Path, log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """The driver, run from `cwd`: its paths are relative, as with the settings' default
    warehouse (``./warehouse``), while the executors run in their workers' directories."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["PYTHONUNBUFFERED"] = "1"
    # A user of the delta-spark engine sets it for the whole job: the JVM and every Python
    # process it starts (the source's runner among them) get it; executors through executorEnv.
    # (The test process pins delta-rs for itself: tests/conftest.py.)
    env["DELTABUS_ENGINE"] = "delta-spark"
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [str(ROOT / "spark-submit.sh"), "--master", cluster.master_url, *CONFS, str(WORKER), "--engine", "delta-spark", *args],
            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def stop(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver and everything under it at once (the JVM, the Python driver, the
    source's runner), frozen first so nothing escapes."""
    if job.poll() is None:
        kill_tree(job.pid)
    job.wait(30)


def sink_rows(uri: str, columns: list[str] | None = None) -> list[dict]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri).to_pyarrow_table(columns=columns).to_pylist()
    except TableNotFoundError:
        return []


def sink_in_order(uri: str) -> list[dict]:
    """The sink's rows with the batch id that wrote each (the txn of its commit: delta-spark's
    sink records the query id and batch id there) and its place in its file. The stream has
    no shuffle, so each task wrote its partition's rows in read order to one file, and a
    batch puts all rows of a key in one partition."""
    import pyarrow.parquet as pq

    out = []
    for log in sorted((Path(uri) / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        batch = next((a["txn"]["version"] for a in actions if "txn" in a), None)
        for a in actions:
            if "add" in a:
                assert batch is not None, f"{log.name}: data written outside a stream batch"
                path = Path(uri) / urllib.parse.unquote(a["add"]["path"])
                for pos, row in enumerate(pq.read_table(path).to_pylist()):
                    out.append({**row, "batch": batch, "pos": pos, "file": a["add"]["path"]})
    return out


def app_dirs(cluster: StandaloneCluster) -> list[set[str]]:
    return [{p.name for p in (cluster.base_dir / d.role).glob("app-*")} for d in cluster.workers]


def test_stream_source_on_a_delta_spark_warehouse_on_a_cluster_survives_sigkill_exactly_once(cluster, tmp_path):
    from deltabus import PublisherClient, SubscriberClient
    from deltabus.config import ClientSettings

    began = time.time()
    warehouse, sink, ck = str(tmp_path / "warehouse"), str(tmp_path / "sink"), str(tmp_path / "ck")
    topic, s = "projects/local/topics/orders", "projects/local/subscriptions/stream-cluster"
    ids_file, log_path = tmp_path / "ids.json", tmp_path / "worker.log"
    seed = int(os.environ.get("STREAM_CRASH_SEED") or time.time_ns())
    rng = random.Random(seed)
    replay = f"kill time from seed {seed}: replay with STREAM_CRASH_SEED={seed}"
    print(replay, flush=True)
    log_path.write_text(replay + "\n")

    def tail() -> str:
        return f"{replay}\n{log_path.read_text(errors='replace')[-4000:]}"

    before = app_dirs(cluster)
    job = start(cluster, tmp_path, log_path, "warehouse", s, "sink", "ck", "--setup", topic, ids_file.name)
    try:
        deadline = time.time() + 240
        while not ids_file.exists():  # the driver's set-up through delta-spark
            assert job.poll() is None and time.time() < deadline, tail()
            time.sleep(0.2)
        set_up_s = time.time() - began
        ids = json.loads(ids_file.read_text())
        # More through delta-rs while the query starts, on the same keys (after the first in their order).
        pub = PublisherClient(warehouse=warehouse, settings=ClientSettings(warehouse=warehouse, engine="delta-rs"))
        assert pub.engine.name == "delta-rs"
        ids += pub.publish_batch(topic, worker.messages(240, 360))
        pub.stop()
        messages = worker.messages(0, 360)
        deadline = time.time() + 240
        while not sink_rows(sink, ["message_id"]):  # kill while batches flow
            assert job.poll() is None and time.time() < deadline, tail()
            time.sleep(0.1)
        time.sleep(rng.uniform(0.0, 3.0))  # somewhere in the next batches: lease, manifest, offset log, sink, commit, ack
        assert job.poll() is None, tail()
    finally:
        stop(job)
        with open(log_path, "a") as f:
            f.write(f"KILLED t={time.time():.1f}\n")
    killed_at = time.time()
    wanted = {i for i, m in zip(ids, messages) if "drop" not in m["attributes"]}
    dropped = set(ids) - wanted
    landed = len(sink_rows(sink, ["message_id"]))
    assert 0 < landed < len(wanted), f"{landed} of {len(wanted)} in the sink at the kill: {tail()}"

    job = start(cluster, tmp_path, log_path, "warehouse", s, "sink", "ck", "--until", str(len(wanted)))
    try:
        assert job.wait(240) == 0, tail()
    finally:
        stop(job)
    text = log_path.read_text(errors="replace")
    after_kill = text[text.rindex("KILLED"):]
    assert re.search(r"^DONE .* backlog delta-spark=0$", after_kill, re.M), tail()  # as the delta-spark engine reads it
    assert "Traceback" not in after_kill, tail()

    rows = sink_rows(sink)
    got = [r["message_id"] for r in rows]
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates; {tail()}"
    assert set(got) == wanted, f"{len(wanted - set(got))} lost, {len(set(got) - wanted)} unexpected; {replay}"
    assert not set(got) & dropped  # the filter held
    by_id = {i: m for i, m in zip(ids, messages)}
    seq = {i: n for n, i in enumerate(ids)}  # publish order: delta-spark's batch, then delta-rs's
    for r in rows:
        assert r["data"] == by_id[r["message_id"]]["data"] and r["ordering_key"] == by_id[r["message_id"]]["ordering_key"]
        assert r["subscription"] == s and r["delivery_attempt"] >= 1
    placed = sink_in_order(sink)
    assert sorted(r["message_id"] for r in placed) == sorted(got)  # the log's files are the table's rows
    assert len({(r["batch"], r["ordering_key"], r["file"]) for r in placed if r["ordering_key"]}) == \
        len({(r["batch"], r["ordering_key"]) for r in placed if r["ordering_key"]})  # a key's rows of a batch in one file
    ordered = sorted((r for r in placed if r["ordering_key"]), key=lambda r: (r["batch"], r["pos"]))
    for k in range(worker.KEYS):
        order = [seq[r["message_id"]] for r in ordered if r["ordering_key"] == f"key{k}"]
        assert order and order == sorted(order), f"key{k} out of publish order: {order}; {replay}"
    sub = SubscriberClient(warehouse=warehouse, settings=ClientSettings(warehouse=warehouse, engine="delta-rs"))
    assert sub.get_backlog(s).num_unacked_messages == 0, replay
    sub.close()
    ledger = next((Path(warehouse) / "_streams").glob("*/default"))
    assert not list(ledger.glob("m-*/*.parquet")), replay  # no live manifest with rows left
    # delta-spark's sink wrote each batch id once, under one query id.
    txns = [json.loads(line)["txn"] for log in sorted((Path(sink) / "_delta_log").glob("*.json"))
            for line in log.read_text().splitlines() if '"txn"' in line]
    assert txns and len({t["appId"] for t in txns}) == 1 and len({t["version"] for t in txns}) == len(txns), txns
    # Both runs ran on the cluster: each worker started an executor for each (two applications).
    new = [after - b for after, b in zip(app_dirs(cluster), before)]
    assert all(len(n) == 2 for n in new), new
    print(f"stream on the cluster: set-up {set_up_s:.0f} s, {len(wanted)} messages, {landed} in the sink at the kill ({killed_at - began:.0f} s in), "
          f"{len({t['version'] for t in txns})} batches, {time.time() - began:.0f} s in all", flush=True)
