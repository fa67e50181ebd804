"""Foundation figures: publish and pull+ack throughput on this machine (not a test).

    .venv/bin/python bench/foundation.py [--batches 50] [--pull-messages 20000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import pyarrow as pa


def publish_rate(warehouse: str, batches: int, size: int = 1024, per_batch: int = 1000) -> dict[str, float]:
    from deltalake import write_deltalake

    from deltabus import PublisherClient, types
    from deltabus.publisher.rows import OutgoingMessage, build_rows

    pub = PublisherClient(warehouse=warehouse)
    topic = pub.topic_path("bench", "publish")
    pub.create_topic(name=topic)
    payload = b"x" * size
    msgs = [types.PubsubMessage(data=payload, attributes={"n": "1"}) for _ in range(per_batch)]
    pub.publish_batch(topic, msgs)  # warm up
    t0 = time.perf_counter()
    for _ in range(batches):
        pub.publish_batch(topic, msgs)
    ours = batches * per_batch / (time.perf_counter() - t0)

    # Raw baseline: the same Arrow rows appended with write_deltalake, no validation or ids.
    rec = pub._registry.topic(topic)
    rows, _ = build_rows(rec.topic_uid, topic, [OutgoingMessage(payload, {"n": "1"}, "", size + 2)] * per_batch, time.time())
    raw_uri = f"{warehouse}/raw"
    write_deltalake(raw_uri, rows, partition_by=["topic_uid"], mode="append")
    t0 = time.perf_counter()
    for _ in range(batches):
        write_deltalake(raw_uri, rows, mode="append")
    raw = batches * per_batch / (time.perf_counter() - t0)
    return {"publish_msgs_per_s": ours, "raw_write_deltalake_msgs_per_s": raw, "ratio": ours / raw}


def pull_ack_rate(warehouse: str, total: int, max_messages: int) -> float:
    from deltabus import PublisherClient, SubscriberClient

    pub = PublisherClient(warehouse=warehouse)
    sub = SubscriberClient(warehouse=warehouse)
    topic = pub.topic_path("bench", f"pull-{max_messages}")
    path = sub.subscription_path("bench", f"pull-{max_messages}")
    pub.create_topic(name=topic)
    sub.create_subscription(name=path, topic=topic, ack_deadline_seconds=600)
    for start in range(0, total, 1000):
        pub.publish_batch(topic, [{"data": b"x" * 1024}] * min(1000, total - start))
    done = 0
    t0 = time.perf_counter()
    while done < total:
        got = sub.pull(subscription=path, max_messages=max_messages, return_immediately=True).received_messages
        sub.acknowledge(subscription=path, ack_ids=[r.ack_id for r in got])
        done += len(got)
    return total / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--pull-messages", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as wh:
        result = publish_rate(wh, args.batches)
        for n in (100, 1000):
            result[f"pull_ack_msgs_per_s_max_messages_{n}"] = pull_ack_rate(wh, args.pull_messages, n)
    print(json.dumps({k: round(v, 2) for k, v in result.items()}, indent=2))


if __name__ == "__main__":
    main()
