"""Child process of test_streaming_source's SIGKILL test: runs a deltabus stream query into a
Delta sink written by batch id (with the batch id and read order as columns), until killed or,
with --until N, until the sink holds N rows and the subscription's backlog is 0.

usage: _stream_worker.py WAREHOUSE SUBSCRIPTION SINK CHECKPOINT [--until N]
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    warehouse, subscription, sink, checkpoint = sys.argv[1:5]
    until = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[5] == "--until" else None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from deltabus.spark.streaming import idempotent_delta_sink, register

    spark = (
        SparkSession.builder.master("local[2]").appName("stream-worker").config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    write = idempotent_delta_sink(sink, "crash-test")

    def numbered(df, batch_id):
        write(df.withColumn("batch", F.lit(batch_id)).withColumn("pos", F.monotonically_increasing_id()), batch_id)
        print(f"BATCH {batch_id} t={time.time():.1f}", flush=True)

    df = (spark.readStream.format("deltabus").option("warehouse", warehouse).option("subscription", subscription)
          .option("maxMessagesPerTrigger", "250").option("rowsPerPartition", "100").option("leaseSeconds", "10")
          .option("pullWaitSeconds", "0.3").load())
    query = (df.writeStream.foreachBatch(numbered).option("checkpointLocation", checkpoint)
             .trigger(processingTime="0.05 seconds").start())
    print(f"STARTED t={time.time():.1f}", flush=True)
    if until is None:
        query.awaitTermination()
        return 1
    from deltalake import DeltaTable

    from deltabus.subscriber.client import SubscriberClient

    sub = SubscriberClient(warehouse=warehouse)
    deadline = time.time() + 150
    while time.time() < deadline:
        if query.exception() is not None:
            print(f"FAILED {query.exception()}", flush=True)
            return 1
        try:
            n = DeltaTable(sink).to_pyarrow_table(columns=["message_id"]).num_rows
        except Exception:
            n = 0
        if n >= until and sub.get_backlog(subscription).num_unacked_messages == 0:
            query.stop()
            print(f"DONE t={time.time():.1f}", flush=True)
            return 0
        time.sleep(0.2)
    print("TIMEOUT", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
