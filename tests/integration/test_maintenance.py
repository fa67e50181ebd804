"""Table maintenance: auto-compaction keeps file counts bounded without changing what is
delivered, and `deltabus maintenance` compacts, checkpoints and vacuums a live warehouse."""

from __future__ import annotations

import os
import subprocess
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus import PublisherClient, SubscriberClient
from deltabus.storage.delta_rs import DeltaRsEngine
from deltabus.storage.maintenance import EXPIRED_LOG_CLEANUP_EVERY, AutoCompact, file_count
from deltabus.storage.tables import TableSpec
from tests.conftest import table_versions
from tests.integration.test_cli import run
from tests.integration.test_seek import drain



def _messages_files(warehouse: str) -> int:
    return file_count(DeltaTable(f"{warehouse}/messages"), None, None)


def _topic_and_subscription(engine: DeltaRsEngine, topic_id: str, ack_deadline_seconds: int) -> tuple[PublisherClient, SubscriberClient, str, str]:
    """Clients over `engine`, a topic and a subscription to it (named after `topic_id`)."""
    engine.ensure_tables()
    pub, sub = PublisherClient(engine=engine), SubscriberClient(engine=engine)
    topic = pub.topic_path("m", topic_id)
    name = sub.subscription_path("m", f"{topic_id}-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=ack_deadline_seconds)
    return pub, sub, topic, name


def test_auto_compaction_bounds_files_and_every_message_is_delivered_once(warehouse):
    engine = DeltaRsEngine(warehouse, auto_compact=AutoCompact(every=5, min_files=4))
    pub, sub, topic, name = _topic_and_subscription(engine, "orders", 60)
    published: list[str] = []
    for i in range(40):
        published += pub.publish_batch(topic, [{"data": f"{i}-{k}".encode()} for k in range(5)])
        if i == 20:  # half of them fanned out and acked between compactions
            got = sub.pull(subscription=name, max_messages=1000).received_messages
            sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
            first = [m.message.message_id for m in got]
    assert _messages_files(warehouse) < 15  # 40 appends, compacted as they went
    ops = [h["operation"] for h in DeltaTable(f"{warehouse}/messages").history()]
    assert "OPTIMIZE" in ops
    rest = []
    while True:
        got = sub.pull(subscription=name, max_messages=1000, return_immediately=True).received_messages
        if not got:
            break
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
        rest += [m.message.message_id for m in got]
    delivered = first + rest
    assert sorted(delivered) == sorted(published)  # each exactly once: compaction is not new data
    pub.stop()
    sub.close()


def test_maintenance_command_compacts_checkpoints_and_vacuums_without_changing_data(warehouse):
    run(warehouse, "topics", "create", "orders")
    run(warehouse, "subscriptions", "create", "orders-sub", "--topic", "orders")
    for i in range(6):
        run(warehouse, "publish", "orders", f"m{i}")
    before = _messages_files(warehouse)
    p = run(warehouse, "maintenance", "--retention-hours", "0")
    assert "messages" in p.stdout and "deliveries" in p.stdout
    assert "retention: 0 unacked messages past their subscription's retention dropped, 0 topics trimmed" in p.stdout
    assert _messages_files(warehouse) < before
    assert (DeltaTable(f"{warehouse}/messages").version()) > 0
    out = run(warehouse, "pull", "orders-sub", "--max-messages", "100", "--ack").stdout
    assert sorted(line for line in out.splitlines() if line) and len(out.splitlines()) == 6

    versions = table_versions(warehouse)
    bad = run(warehouse, "maintenance", "--retention-hours", "-1", ok=False)
    assert bad.returncode == 1 and "--retention-hours" in bad.stderr  # the CLI names its own flag
    assert table_versions(warehouse) == versions  # nothing written


def test_read_first_is_the_sorted_prefix_of_a_full_read(warehouse):
    engine = DeltaRsEngine(warehouse, auto_compact=None)
    engine.ensure_tables()
    from tests.integration.test_engine_contract import INSERT, on, rows

    # Several files with overlapping id ranges (each merge writes its own file).
    for ids in (["05", "01", "09"], ["02", "08"], ["03", "07", "04"], ["06"]):
        engine.snapshot("deliveries").merge(rows("sa", ids), on("sa"), INSERT)
    snap = engine.snapshot("deliveries")
    keys = [("message_id", "ascending")]
    full = sorted(snap.read(columns=["message_id"], partition="sa")["message_id"].to_pylist())
    for limit in (1, 2, 4, 9, 20):
        got = snap.read_first(limit, keys, ["message_id"], partition="sa")["message_id"].to_pylist()
        assert got == full[:limit], limit
    skip_all = snap.read_first(5, keys, ["message_id"], partition="sa", skip_files=lambda a: pa.array([True] * a.num_rows))
    assert skip_all.num_rows == 0


def test_the_deliveries_log_is_cleaned_behind_its_checkpoints_and_nothing_is_lost(warehouse):
    """deliveries keeps 15 minutes of log (TableSpec.log_keep_seconds): with a clock an hour
    ahead, every 100 commits the engine deletes the commit files before its latest
    checkpoint. Rows, the cursors (application transactions) and a handle opened before
    the cleanups all survive; the messages table (no log_keep_seconds) keeps its log."""

    from deltabus.storage.maintenance import LogCleanup
    from deltabus.storage.tables import DELIVERIES

    engine = DeltaRsEngine(warehouse, clock=lambda: time.time() + 3600, log_cleanup=LogCleanup(every=100))
    engine.ensure_tables()
    before = DeltaTable(engine.table_uri("deliveries"))
    schema = DELIVERIES.schema
    for i in range(260):
        row = {c: None for c in schema.names} | {"sub_uid": "s1", "message_id": f"m{i:04d}", "delivery_attempt": 0}
        txn = ("cursor-early", 5) if i == 0 else (f"cursor-{i % 3}", i)  # one cursor written only before every checkpoint
        assert engine.append("deliveries", pa.Table.from_pylist([row], schema=schema), app_txn=txn)
        engine.append("messages", _message(i))
    log = lambda t: sorted(f for f in os.listdir(f"{warehouse}/{t}/_delta_log") if f.endswith(".json"))  # noqa: E731
    kept = log("deliveries")
    assert len(kept) < 120 and kept[0] >= f"{199:020d}.json"  # only what follows the checkpoint at 199
    assert len(log("messages")) > 260
    fresh = DeltaRsEngine(warehouse).snapshot("deliveries")
    assert fresh.read(columns=["message_id"]).num_rows == 260
    assert [fresh.txn_version(f"cursor-{k}") for k in range(3)] == [258, 259, 257]
    assert fresh.txn_version("cursor-early") == 5  # kept by the checkpoints, its commit file long gone
    before.update_incremental()  # a handle from before the cleanups starts again from the checkpoint
    assert before.version() == fresh.version and pa.table(before.to_pyarrow_table()).num_rows == 260


def _message(i: int) -> pa.Table:
    from deltabus.storage.tables import MESSAGES

    row = {c: None for c in MESSAGES.schema.names} | {"topic_uid": "t1", "message_id": f"m{i:04d}", "data": b"x"}
    return pa.Table.from_pylist([row], schema=MESSAGES.schema)


def _run_until_killed(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter over this checkout's lib/ and check that it ended by
    SIGKILL (it kills itself at the moment the test wants)."""
    import signal
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "lib")}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return proc


def test_a_log_cleanup_killed_halfway_leaves_a_readable_table_and_the_next_one_finishes(warehouse):
    from deltabus.storage.maintenance import LogCleanup, clean_log
    from deltabus.storage.tables import DELIVERIES

    engine = DeltaRsEngine(warehouse, log_cleanup=None)
    engine.ensure_tables()
    schema = DELIVERIES.schema
    for i in range(120):  # a checkpoint at 99, nothing cleaned (log_cleanup=None)
        row = {c: None for c in schema.names} | {"sub_uid": "s1", "message_id": f"m{i:04d}", "delivery_attempt": 0}
        engine.append("deliveries", pa.Table.from_pylist([row], schema=schema), app_txn=("cursor", i))
    uri = engine.table_uri("deliveries")
    # A process that cleans the log and is SIGKILLed after its 10th deletion.
    code = (
        "import os, signal, sys, time\n"
        "from deltabus.storage import maintenance as m\n"
        "real, n = os.remove, [0]\n"
        "def remove(p):\n"
        "    real(p); n[0] += 1\n"
        "    if n[0] == 10: os.kill(os.getpid(), signal.SIGKILL)\n"
        "m.os.remove = remove\n"
        "m.clean_log(sys.argv[1], time.time() + 3600, 900)\n"
    )
    _run_until_killed(code, uri)
    old = lambda: [f for f in os.listdir(f"{uri}/_delta_log") if f.endswith(".json") and int(f[:20]) < 99]  # noqa: E731
    assert 0 < len(old()) < 99  # killed halfway: some of the commit files before the checkpoint remain
    snap = DeltaRsEngine(warehouse).snapshot("deliveries")
    assert snap.read(columns=["message_id"]).num_rows == 120 and snap.txn_version("cursor") == 119
    assert clean_log(uri, time.time() + 3600, 900) > 0  # the next cleanup finishes the job
    assert old() == []
    assert DeltaRsEngine(warehouse).snapshot("deliveries").read(columns=["message_id"]).num_rows == 120


# A table of its own whose log expires after an hour (Delta's property, which delta-rs's
# post-commit hook applies): created with DeltaTable.create, written through the engine.
_EXPIRING = TableSpec(
    "expiring_log",
    layers=((pa.field("part", pa.string(), nullable=False), pa.field("n", pa.int64())),),
    partition_by=("part",),
    configuration={"delta.logRetentionDuration": "interval 1 hour"},
)


def test_delta_rs_expired_log_cleanup_runs_on_one_version_in_a_hundred_and_still_cleans(warehouse):
    """delta-rs's expired-log hook lists the whole log after every commit; the engine lets it
    run only on the versions delta-rs checkpoints at (99, 199, ...: storage/maintenance.py).
    Aged log files survive a commit at any other version, and are deleted at the next such
    version; every row stays readable."""
    assert EXPIRED_LOG_CLEANUP_EVERY == 100
    engine = DeltaRsEngine(warehouse, extra_tables=(_EXPIRING,), auto_compact=None, log_cleanup=None)
    uri = engine.table_uri(_EXPIRING.name)
    DeltaTable.create(uri, _EXPIRING.schema, partition_by=["part"], configuration=dict(_EXPIRING.configuration))
    log_dir = os.path.join(uri, "_delta_log")

    def commit_file(version: int) -> str:
        return os.path.join(log_dir, f"{version:020d}.json")

    row = pa.table({"part": ["a"], "n": pa.array([1], pa.int64())})

    def append_until(version: int) -> None:
        while engine.version(_EXPIRING.name) < version:
            engine.append(_EXPIRING.name, row)

    append_until(99)  # the checkpoint at 99 is written; its log files are all young yet
    assert os.path.exists(os.path.join(log_dir, f"{99:020d}.checkpoint.parquet"))
    assert os.path.exists(commit_file(0))
    old = time.time() - 2 * 3600
    for name in os.listdir(log_dir):  # as if two hours had passed
        os.utime(os.path.join(log_dir, name), (old, old))
    append_until(100)
    assert os.path.exists(commit_file(0)), "a commit at version 100 ran the expired-log cleanup"
    append_until(198)
    assert os.path.exists(commit_file(0))
    append_until(199)  # the hook runs: the aged files before the checkpoint at 99 go
    assert not os.path.exists(commit_file(0))
    assert not os.path.exists(commit_file(98))
    assert all(os.path.exists(commit_file(v)) for v in range(100, 200))  # young: kept
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 199


def _message_files(warehouse: str) -> list[tuple[str, int, str, str, list[int]]]:
    """(path, rows, min id, max id, rows of each row group) of the messages table's live files, by min id."""
    import pyarrow.parquet as pq

    dt = DeltaTable(f"{warehouse}/messages")
    actions = pa.table(dt.get_add_actions(flatten=True)).sort_by("min.message_id")
    out = []
    for path, rows, lo, hi in zip(actions["path"].to_pylist(), actions["num_records"].to_pylist(),
                                  actions["min.message_id"].to_pylist(), actions["max.message_id"].to_pylist()):
        meta = pq.ParquetFile(f"{warehouse}/messages/{path}").metadata
        out.append((path, rows, lo, hi, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]))
    return out


def test_messages_compaction_writes_bounded_files_of_small_row_groups_and_lookups_find_every_payload(warehouse):
    """Auto-compaction lays the messages table out as its spec says (``TableSpec.layout``):
    files stop growing at the target size and keep disjoint id ranges, row groups hold at
    most ``row_group_rows`` rows, and payload lookups (which skip row groups by their
    statistics) still find every message."""
    import random

    import pyarrow.parquet as pq

    from deltabus.delivery.payloads import fetch_messages
    from deltabus.storage.tables import MESSAGES

    layout = MESSAGES.layout
    assert layout is not None
    # A small target (the layout's row groups stay): the bound shows at test size.
    target = 512 * 1024
    engine = DeltaRsEngine(warehouse, auto_compact=AutoCompact(every=5, min_files=4, target_size=target))
    engine.ensure_tables()
    pub = PublisherClient(engine=engine)
    topic = pub.topic_path("m", "big")
    pub.create_topic(name=topic)
    published: dict[str, bytes] = {}
    for i in range(20):
        batch = [{"data": f"{i}-{k}".encode()} for k in range(layout.row_group_rows)]
        for mid, m in zip(pub.publish_batch(topic, batch), batch):
            published[mid] = m["data"]
    files = _message_files(warehouse)
    assert len(files) < 15, "auto-compaction did not run"
    for path, *_ in files:  # compacted files stay compressed, and stop growing at the target
        file = f"{warehouse}/messages/{path}"
        assert os.path.getsize(file) <= 2 * target  # delta-rs rolls a file over near the target, not exactly at it
        assert pq.ParquetFile(file).metadata.row_group(0).column(1).compression != "UNCOMPRESSED"
    assert max(max(groups) for *_, groups in files) <= layout.row_group_rows
    assert any(len(groups) > 1 for *_, groups in files), "no compacted file spans several row groups"
    assert any(rows > layout.row_group_rows for _, rows, *_ in files)
    for (_, _, _, hi, _), (_, _, lo, _, _) in zip(files, files[1:]):
        assert hi < lo, "compacted files overlap in message ids"
    topic_uid = files[0][0].split("/", 1)[0].removeprefix("topic_uid=")
    ids = sorted(published)
    rng = random.Random(7)
    for wanted in ([ids[0]], [ids[-1]], ids[5000:6000], rng.sample(ids, 300), ids[::997], ids):
        got = fetch_messages(engine, topic_uid, wanted)
        assert {m: r["data"] for m, r in got.items()} == {m: published[m] for m in wanted}


def test_a_lookup_by_id_range_reads_only_the_row_groups_that_can_hold_it(tmp_path):
    """``row_groups_in`` narrows a real Parquet file to the row groups whose statistics
    overlap the range; a read of the narrowed fragment finds exactly the rows in range."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from deltabus.storage.arrow import row_groups_in

    ids = [f"{i:08d}" for i in range(10_000)]
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"message_id": ids, "n": list(range(10_000))}), path, row_group_size=1_000)
    fragment = pads.ParquetFileFormat().make_fragment(path, filesystem=pafs.LocalFileSystem())
    narrowed = row_groups_in(fragment, ("message_id", "00002500", "00004100"))
    assert [g.id for g in narrowed.row_groups] == [2, 3, 4]
    got = narrowed.to_table(filter=pads.field("message_id").isin(ids[2500:4101]))
    assert got["message_id"].to_pylist() == ids[2500:4101]
    assert row_groups_in(fragment, None) is fragment
    assert [g.id for g in row_groups_in(fragment, ("message_id", "a", "b")).row_groups] == []
    assert row_groups_in(fragment, ("message_id", "0", "z")) is fragment


# Seconds into the first auto-compaction at which the publisher is killed. Measured here: at
# 20 ms delta-rs had written nothing yet, at 30 ms the compaction had committed; the moment
# between its new files and its commit is a few ms wide, so the kill sweeps across it.
_KILL_DELAYS = (0.0, 0.01, 0.02, 0.024, 0.027, 0.03, 0.035, 0.06)


@pytest.mark.parametrize("delay", _KILL_DELAYS)
def test_a_publisher_killed_during_a_messages_compaction_loses_and_duplicates_nothing(warehouse, delay):
    """SIGKILL lands while auto-compaction rewrites the messages table with its layout
    (``TableSpec.layout``): the table still reads, every message whose publish returned is
    there exactly once, no message is there twice, a subscription made before gets each one
    exactly once, and the next compaction completes."""
    from deltabus.storage.maintenance import compact_table
    from deltabus.storage.tables import MESSAGES

    pub, sub, topic, name = _topic_and_subscription(DeltaRsEngine(warehouse, auto_compact=None), "killed", 600)
    # The child publishes batches of incompressible payloads (so a compaction takes tens of
    # ms), prints each batch's ids once publish_batch returns, and SIGKILLs itself `delay`
    # seconds into the first compaction (delta-rs writes the new files, then commits).
    code = (
        "import os, signal, sys, threading\n"
        "from deltabus import PublisherClient\n"
        "from deltabus.storage import maintenance as m\n"
        "from deltabus.storage.delta_rs import DeltaRsEngine\n"
        "from deltabus.storage.maintenance import AutoCompact\n"
        "real = m.compact\n"
        "def compact(*a, **k):\n"
        "    threading.Timer(float(sys.argv[3]), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()\n"
        "    return real(*a, **k)\n"
        "m.compact = compact\n"
        "pub = PublisherClient(engine=DeltaRsEngine(sys.argv[1], auto_compact=AutoCompact(every=5, min_files=4)))\n"
        "for i in range(40):\n"
        "    ids = pub.publish_batch(sys.argv[2], [{'data': os.urandom(100)} for _ in range(5000)])\n"
        "    print(' '.join(ids), 'END', flush=True)\n"
    )
    proc = _run_until_killed(code, warehouse, topic, str(delay))
    # Only whole lines (a kill can land while a line is being written).
    returned = [m for line in proc.stdout.splitlines() if line.endswith(" END") for m in line.split()[:-1]]
    assert len(returned) >= 5000 * 3  # the first compaction comes after a few publishes

    def stored() -> list[str]:
        return DeltaTable(f"{warehouse}/messages").to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist()

    ids = stored()
    assert len(ids) == len(set(ids)), "a message is stored twice"
    assert set(returned) <= set(ids), "a message whose publish returned is gone"
    payloads = sorted(DeltaTable(f"{warehouse}/messages").to_pyarrow_table(columns=["data"])["data"].to_pylist())
    assert drain(sub, name) == payloads  # each stored message delivered exactly once (the payloads are random)
    dt = DeltaTable(f"{warehouse}/messages")
    topic_uid = pa.table(dt.get_add_actions(flatten=True)).column("partition.topic_uid")[0].as_py()
    compact_table(dt, MESSAGES, topic_uid)  # the next compaction completes
    assert file_count(DeltaTable(f"{warehouse}/messages"), None, None) == 1
    after = stored()
    assert sorted(after) == sorted(ids)
