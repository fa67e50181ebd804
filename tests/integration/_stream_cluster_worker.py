"""Driver of test_streaming_source_cluster: a deltabus stream query on a standalone cluster,
on a warehouse of the delta-spark engine, into delta-spark's own sink.

Started as users start jobs (``./spark-submit.sh --master spark://… <this> --engine delta-spark …``:
the Delta jars and session settings come from spark-submit.sh; DELTABUS_ENGINE=delta-spark in
the environment of the whole job).
With --setup it first creates the warehouse, the topic and a subscription (filter, ordering
keys) and publishes, all through the delta-spark engine, and writes the published ids to
IDS_FILE. Then it runs ``readStream.format("deltabus")`` into ``writeStream.format("delta")`` (checkpointed, so each
batch id is written at most once), until killed or, with --until N, until the sink holds N
rows and the subscription's backlog is 0; then it prints each batch's progress and the
backlog as the delta-spark engine reads it, and exits 0.

usage: _stream_cluster_worker.py --engine delta-spark WAREHOUSE SUBSCRIPTION SINK CHECKPOINT
                                 [--setup TOPIC IDS_FILE] [--until N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


FILTER = "NOT attributes:drop"
KEYS = 5


def messages(lo: int, hi: int) -> list[dict]:
    """A third keyless, the rest on KEYS keys; one in eight filtered out (attribute drop)."""
    return [{"data": f"m{i}".encode(), "ordering_key": "" if i % 3 == 0 else f"key{i % KEYS}",
             "attributes": {"drop": "1"} if i % 8 == 7 else {"n": str(i)}} for i in range(lo, hi)]


def setup(warehouse: str, topic: str, subscription: str, ids_file: str) -> None:
    """The warehouse, topic, subscription and first messages, through the delta-spark engine
    (this driver's session); the ids go to `ids_file`, written whole at once."""
    from deltabus import PublisherClient, SubscriberClient
    from deltabus.config import ClientSettings

    began = time.time()
    settings = ClientSettings(warehouse=warehouse, engine="delta-spark")
    pub = PublisherClient(warehouse=warehouse, settings=settings, create_warehouse=True)
    sub = SubscriberClient(warehouse=warehouse, settings=settings)
    assert pub.engine.name == sub.engine.name == "delta-spark", (pub.engine.name, sub.engine.name)
    pub.create_topic(name=topic)
    sub.create_subscription(request={"name": subscription, "topic": topic, "ack_deadline_seconds": 10,
                                     "enable_message_ordering": True, "filter": FILTER})
    ids = pub.publish_batch(topic, messages(0, 240))
    tmp = ids_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(ids, f)
    os.replace(tmp, ids_file)
    print(f"SETUP t={time.time():.1f} took={time.time() - began:.1f}s engine={pub.engine.name} published={len(ids)}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", required=True)
    p.add_argument("warehouse")
    p.add_argument("subscription")
    p.add_argument("sink")
    p.add_argument("checkpoint")
    p.add_argument("--setup", nargs=2, metavar=("TOPIC", "IDS_FILE"))
    p.add_argument("--until", type=int)
    args = p.parse_args()
    assert os.environ.get("DELTABUS_ENGINE") == args.engine, os.environ.get("DELTABUS_ENGINE")  # set for the whole job
    from pyspark.sql import SparkSession

    from deltabus.spark.streaming import register

    spark = SparkSession.builder.appName("stream-cluster-worker").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print(f"SESSION t={time.time():.1f} master={spark.sparkContext.master}", flush=True)
    if args.setup:
        setup(args.warehouse, args.setup[0], args.subscription, args.setup[1])
    register(spark)
    df = (spark.readStream.format("deltabus").option("warehouse", args.warehouse).option("subscription", args.subscription)
          .option("maxMessagesPerTrigger", "60").option("rowsPerPartition", "25").option("leaseSeconds", "10")
          .option("pullWaitSeconds", "0.3").load())
    # No shuffle: each task writes its partition's rows, in read order, to one file of the
    # batch's commit (the test reads the order back from the sink's log and files).
    query = (df.writeStream.format("delta").option("checkpointLocation", args.checkpoint)
             .trigger(processingTime="0.2 seconds").start(args.sink))
    print(f"STARTED t={time.time():.1f}", flush=True)
    if args.until is None:
        query.awaitTermination()
        return 1
    from deltalake import DeltaTable

    from deltabus import SubscriberClient
    from deltabus.config import ClientSettings

    rs = SubscriberClient(warehouse=args.warehouse, settings=ClientSettings(warehouse=args.warehouse, engine="delta-rs"))
    deadline = time.time() + 240
    while time.time() < deadline:
        if query.exception() is not None:
            print(f"FAILED {query.exception()}", flush=True)
            return 1
        try:
            n = DeltaTable(args.sink).to_pyarrow_table(columns=["message_id"]).num_rows
        except Exception:
            n = 0
        if n >= args.until and rs.get_backlog(args.subscription).num_unacked_messages == 0:
            for progress in query.recentProgress:  # where the time went, batch by batch
                print(f"PROGRESS {progress.batchId} rows={progress.numInputRows} at={progress.timestamp} "
                      f"ms={json.dumps(progress.durationMs, sort_keys=True)}", flush=True)
            query.stop()
            ds = SubscriberClient(warehouse=args.warehouse, settings=ClientSettings(warehouse=args.warehouse, engine="delta-spark"))
            print(f"DONE t={time.time():.1f} rows={n} backlog {ds.engine.name}="
                  f"{ds.get_backlog(args.subscription).num_unacked_messages}", flush=True)
            return 0
        time.sleep(0.3)
    print("TIMEOUT", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
