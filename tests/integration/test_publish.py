import datetime as dt

import pytest
from deltalake import DeltaTable


from deltabus import InvalidArgument, NotFound, PublisherClient, types
from deltabus.validation import MAX_DATA_BYTES
from tests.conftest import table_versions
from deltabus.storage.arrow import read_table


def messages_table(warehouse):
    return read_table(f"{warehouse}/messages")


def test_publish_resolves_to_committed_message_id(pub: PublisherClient, topic, warehouse):
    before = dt.datetime.now(dt.timezone.utc)
    mid = pub.publish(topic, b"payload", color="red").result(timeout=30)
    rows = messages_table(warehouse).to_pylist()
    assert [r["message_id"] for r in rows] == [mid]
    row = rows[0]
    assert row["data"] == b"payload" and dict(row["attributes"]) == {"color": "red"} and row["topic"] == topic
    assert before <= row["publish_time"] <= dt.datetime.now(dt.timezone.utc)
    assert row["publish_time"].tzinfo is not None


def test_single_publishes_are_batched_into_few_commits(warehouse, topic):
    client = PublisherClient(warehouse=warehouse, batch_settings=types.BatchSettings(max_messages=50, max_latency=0.5))
    v0 = DeltaTable(f"{warehouse}/messages").version()
    futures = [client.publish(topic, f"m{i}".encode()) for i in range(200)]
    ids = [f.result(timeout=30) for f in futures]
    client.stop()
    assert len(set(ids)) == 200
    commits = DeltaTable(f"{warehouse}/messages").version() - v0
    assert commits == 4  # 200 messages / 50 per batch
    assert sorted(r.decode() for r in messages_table(warehouse)["data"].to_pylist()) == sorted(f"m{i}" for i in range(200))


def test_publish_batch_is_one_commit_and_keeps_order(pub, topic, warehouse):
    v0 = DeltaTable(f"{warehouse}/messages").version()
    msgs = [types.PubsubMessage(data=f"{i}".encode(), attributes={"i": str(i)}, ordering_key="k") for i in range(1000)]
    ids = pub.publish_batch(topic, msgs)
    assert DeltaTable(f"{warehouse}/messages").version() == v0 + 1
    assert len(set(ids)) == 1000 and ids == sorted(ids)
    table = messages_table(warehouse)
    by_id = {r["message_id"]: r for r in table.to_pylist()}
    assert all(by_id[m]["data"] == f"{i}".encode() and by_id[m]["ordering_key"] == "k" for i, m in enumerate(ids))


def test_publish_to_deleted_topic_is_not_found(pub, topic, warehouse):
    pub.delete_topic(topic=topic)
    before = table_versions(warehouse)
    with pytest.raises(NotFound):
        pub.publish(topic, b"x").result(timeout=30)
    with pytest.raises(NotFound):
        pub.publish_batch(topic, [{"data": b"x"}])
    assert table_versions(warehouse) == before


@pytest.mark.parametrize(
    "data, attrs, field",
    [
        ("not bytes", {}, "message.data"),
        (b"x" * (MAX_DATA_BYTES + 1), {}, "message.data"),
        (b"", {}, "message"),
        (b"x", {f"k{i}": "v" for i in range(101)}, "message.attributes"),
        (b"x", {"k" * 257: "v"}, "message.attributes"),
        (b"x", {"k": "v" * 1025}, "message.attributes['k']"),
    ],
)
def test_bad_single_publish_raises_at_once_and_writes_nothing(pub, topic, warehouse, data, attrs, field):
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:
        pub.publish(topic, data, **attrs)
    assert e.value.field == field
    pub.stop()
    assert table_versions(warehouse) == before


def test_one_bad_message_fails_the_whole_batch(pub, topic, warehouse):
    before = table_versions(warehouse)
    msgs = [{"data": b"fine"}] * 10 + [{"data": b"", "attributes": {}}] + [{"data": b"fine"}]
    with pytest.raises(InvalidArgument) as e:
        pub.publish_batch(topic, msgs)
    assert e.value.field == "messages[10]"
    with pytest.raises(InvalidArgument) as e:
        pub.publish_batch(topic, [{"data": b"x", "colour": "red"}])
    assert e.value.field == "messages[0]"
    with pytest.raises(InvalidArgument):
        pub.publish_batch(topic, [])
    with pytest.raises(InvalidArgument) as e:
        pub.publish_batch("orders", [{"data": b"x"}])
    assert e.value.field == "topic"
    assert table_versions(warehouse) == before


def test_publish_after_stop_is_refused(pub, topic):
    pub.stop()
    from deltabus import Cancelled

    with pytest.raises(Cancelled):
        pub.publish(topic, b"late")


def test_concurrent_publishers_never_conflict(tmp_path, topic, warehouse):
    import threading

    # More writers than delta-rs's 15 back-to-back version retries can absorb.
    clients = [PublisherClient(warehouse=warehouse) for _ in range(8)]
    errors = []

    def run(c):
        try:
            for i in range(15):
                c.publish_batch(topic, [{"data": f"{i}".encode()}] * 100)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert messages_table(warehouse).num_rows == 12000


def test_ordering_key_needs_message_ordering_enabled(warehouse, topic, sub, subscription):
    from deltabus import OrderingNotEnabled
    from deltabus.types import PublisherOptions

    plain = PublisherClient(warehouse=warehouse)
    before = table_versions(warehouse)
    with pytest.raises(OrderingNotEnabled, match="ordering key.*not enabled") as e:
        plain.publish(topic, b"x", ordering_key="k")
    # google-cloud-pubsub raises ValueError here; RuntimeError catches it as well.
    assert isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)
    plain.stop()
    assert table_versions(warehouse) == before

    # publish_batch is Pub/Sub's Publish RPC: one commit, so ordering keys need no option.
    plain2 = PublisherClient(warehouse=warehouse)
    plain2.publish_batch(topic, [{"data": b"a", "ordering_key": "k"}])
    plain2.stop()

    ordered = PublisherClient(warehouse=warehouse, publisher_options=PublisherOptions(enable_message_ordering=True))
    ordered.publish(topic, b"b", ordering_key="k").result(timeout=30)
    ordered.stop()
    got = sub.pull(subscription=subscription, max_messages=5, return_immediately=True).received_messages
    assert sorted((r.message.data, r.message.ordering_key) for r in got) == [(b"a", "k"), (b"b", "k")]

    as_tuple = PublisherClient(warehouse=warehouse, publisher_options=(True,))  # google-cloud-pubsub takes a tuple too
    assert as_tuple.publisher_options.enable_message_ordering is True
    as_tuple.stop()
    with pytest.raises(InvalidArgument) as bad:
        PublisherOptions(enable_message_ordering="yes")
    assert bad.value.field == "publisher_options.enable_message_ordering"
