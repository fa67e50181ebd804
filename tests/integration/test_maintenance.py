"""Table maintenance: auto-compaction keeps file counts bounded without changing what is
delivered, and `deltabus maintenance` compacts, checkpoints and vacuums a live warehouse."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from deltabus import PublisherClient, SubscriberClient
from deltabus.storage.delta_rs import DeltaRsEngine
from deltabus.storage.maintenance import AutoCompact, file_count
from tests.conftest import table_versions
from tests.integration.test_cli import run


def _messages_files(warehouse: str) -> int:
    return file_count(DeltaTable(f"{warehouse}/messages"), None, None)


def test_auto_compaction_bounds_files_and_every_message_is_delivered_once(warehouse):
    engine = DeltaRsEngine(warehouse, auto_compact=AutoCompact(every=5, min_files=4))
    engine.ensure_tables()
    pub, sub = PublisherClient(engine=engine), SubscriberClient(engine=engine)
    topic = pub.topic_path("m", "orders")
    name = sub.subscription_path("m", "orders-sub")
    pub.create_topic(name=topic)
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=60)
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
