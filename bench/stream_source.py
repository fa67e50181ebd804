"""The subscription as a Spark stream (issue 17) against a plain batch read, not a test.

    ./bench/stream_source.sh [--messages 30000] [--size 100] [--per-trigger 5000] [--out FILE]

One run, one SparkSession (local[2]), one warehouse in a scratch directory:

1. publish MESSAGES messages of SIZE bytes to a topic with one subscription;
2. stream: ``spark.readStream.format("deltabus")`` with ``maxMessagesPerTrigger`` PER_TRIGGER
   into a delta-rs table through ``idempotent_delta_sink`` (each batch one commit, acked when
   Spark commits it), until the sink holds every message; timed from ``start()`` and from
   the end of the first batch (the query's own start-up: its runtime, the first lease);
3. baseline: ``spark.read`` of the same rows from the ``messages`` table (the batch table
   source, no leases and no acks), the same columns, written to another table by the same
   sink function as one batch.

Prints one JSON object (and writes it to FILE with --out): messages/s of each, and their
ratio. The scratch directory is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))


def _rows(uri: str) -> int:
    """Rows in the Delta table at `uri` from its log's file statistics (no data read)."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))  # an arro3 table: convert
    except TableNotFoundError:
        return 0
    return int(sum(actions.column("num_records").to_pylist()))


def run(messages: int, size: int, per_trigger: int, scratch: Path) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from deltabus import PublisherClient, SubscriberClient
    from deltabus.spark import streaming, table_source
    from deltabus.spark.streaming import idempotent_delta_sink

    wh = str(scratch / "warehouse")
    pub, sub = PublisherClient(warehouse=wh), SubscriberClient(warehouse=wh)
    topic, name = pub.topic_path("bench", "stream"), sub.subscription_path("bench", "stream")
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": name, "topic": topic, "ack_deadline_seconds": 60})
    data = b"x" * size
    t0 = time.perf_counter()
    for start in range(0, messages, 10_000):
        pub.publish_batch(topic, [{"data": data, "attributes": {"i": str(i)}} for i in range(start, min(messages, start + 10_000))])
    published_s = time.perf_counter() - t0

    spark = (SparkSession.builder.master("local[2]").appName("deltabus-bench-stream")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        streaming.register(spark)
        table_source.register(spark)
        out: dict[str, Any] = {"messages": messages, "size_bytes": size, "per_trigger": per_trigger,
                               "publish_seconds": round(published_s, 2)}

        # 2. the stream
        sink = str(scratch / "sink-stream")
        df = (spark.readStream.format(streaming.NAME).option("warehouse", wh).option("subscription", name)
              .option("maxMessagesPerTrigger", str(per_trigger)).load())
        batches: list[float] = []
        write = idempotent_delta_sink(sink, "bench-stream")

        def timed_write(batch: Any, batch_id: int) -> None:
            write(batch, batch_id)
            batches.append(time.perf_counter())

        t0 = time.perf_counter()
        query = (df.writeStream.foreachBatch(timed_write).option("checkpointLocation", str(scratch / "chk"))
                 .trigger(processingTime="0 seconds").start())
        try:
            deadline = time.monotonic() + 600
            while _rows(sink) < messages:
                if query.exception() is not None:
                    raise RuntimeError(f"the stream failed: {query.exception()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the stream wrote {_rows(sink)} of {messages} in 600 s")
                time.sleep(0.05)
            done = time.perf_counter()
        finally:
            query.stop()
        first = batches[0]
        after_first = messages - min(per_trigger, messages)
        out["stream"] = {
            "seconds": round(done - t0, 2),
            "msgs_per_s": round(messages / (done - t0), 1),
            "first_batch_seconds": round(first - t0, 2),
            "msgs_per_s_after_first_batch": round(after_first / (done - first), 1) if done > first else None,
            "batches": len(batches),
        }
        out["sink_rows_stream"] = _rows(sink)

        # 3. the same rows, read as a batch from the messages table, through the same writer
        plain = str(scratch / "sink-plain")
        t0 = time.perf_counter()
        rows = (spark.read.format("deltabus_table").option("table", "messages").load(f"{wh}/messages")
                .select("message_id", "data", "attributes", "ordering_key", "publish_time",
                        F.lit(1).cast("int").alias("delivery_attempt"), F.lit(name).alias("subscription")))
        idempotent_delta_sink(plain, "bench-plain")(rows, 0)
        plain_s = time.perf_counter() - t0
        out["plain_read"] = {"seconds": round(plain_s, 2), "msgs_per_s": round(messages / plain_s, 1)}
        out["sink_rows_plain"] = _rows(plain)
        out["stream_vs_plain"] = round(out["stream"]["msgs_per_s"] / out["plain_read"]["msgs_per_s"], 3)
        return out
    finally:
        spark.stop()
        pub.stop()
        sub.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=30_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--per-trigger", type=int, default=5_000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    for field in ("messages", "size", "per_trigger"):
        if getattr(args, field) < 1:
            ap.error(f"--{field.replace('_', '-')}: must be at least 1")
    with tempfile.TemporaryDirectory(prefix="deltabus-stream-bench-") as scratch:
        result = run(args.messages, args.size, args.per_trigger, Path(scratch))
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
