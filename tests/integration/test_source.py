"""The messages stream source: offsets are Delta versions; both readers yield the same rows."""

from __future__ import annotations

import time

import pytest

from deltabus.spark.source import NAME, register

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("reader", ["simple", "partitioned"])
def test_stream_yields_each_message_once_with_version_ranges(spark, pub, topic, warehouse, tmp_path, reader):
    register(spark)
    batches: list[tuple[int, list[dict]]] = []

    def collect(df, batch_id):  # test-local sink; the job itself passes a bound method
        batches.append((batch_id, df.toArrow().to_pylist()))

    query = (
        spark.readStream.format(NAME).option("reader", reader).load(f"{warehouse}/messages")
        .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="0.2 seconds").start()
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not batches:
            time.sleep(0.1)
        ids = pub.publish_batch(topic, [{"data": b"a"}] * 3) + pub.publish_batch(topic, [{"data": b"b"}] * 2)
        while time.time() < deadline and sum(1 for _, rows in batches for r in rows if r["message_id"]) < 5:
            time.sleep(0.1)
        seen_batches = len(batches)
        while time.time() < deadline and len(batches) < seen_batches + 3:
            time.sleep(0.1)  # the query keeps ticking without new messages
    finally:
        query.stop()
    rows = [r for _, rs in batches for r in rs if r["message_id"]]
    assert sorted(r["message_id"] for r in rows) == sorted(ids)
    assert all(r["size_bytes"] == 1 and r["topic_uid"] for r in rows)
    markers = [[r for r in rs if r["message_id"] is None] for _, rs in batches]
    assert all(len(m) == 1 for m in markers)  # one marker per batch, even an empty one
    ranges = [(m[0]["range_start"], m[0]["range_end"]) for m in markers]
    assert all(a <= b for a, b in ranges)
    assert all(prev[1] == nxt[0] for prev, nxt in zip(ranges, ranges[1:]))  # contiguous, no gap, no overlap
    for batch_rows, (a, b) in zip(([r for r in rs if r["message_id"]] for _, rs in batches), ranges):
        assert all(a < r["version"] <= b for r in batch_rows)
