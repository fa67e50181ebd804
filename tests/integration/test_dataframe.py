import pytest
from deltalake import DeltaTable


from deltabus import InvalidArgument, NotFound
from tests.conftest import table_versions
from deltabus.storage.arrow import read_table

pytestmark = pytest.mark.spark


def test_dataframe_is_published_as_one_commit(spark, pub, sub, topic, subscription, warehouse):
    df = spark.createDataFrame(
        [(f"row {i}", {"i": str(i)}, "key" if i % 2 else None) for i in range(500)],
        "data string, attributes map<string,string>, ordering_key string",
    )
    v0 = DeltaTable(f"{warehouse}/messages").version()
    assert pub.publish_dataframe(topic, df) == 500
    assert DeltaTable(f"{warehouse}/messages").version() == v0 + 1
    got = sub.pull(subscription=subscription, max_messages=1000, return_immediately=True).received_messages
    assert len(got) == 500
    for r in got:
        i = int(r.message.attributes["i"])
        assert r.message.data == f"row {i}".encode()
        assert r.message.ordering_key == ("key" if i % 2 else "")


def test_binary_data_only(spark, pub, topic, warehouse):
    df = spark.createDataFrame([(bytearray(b"\x00\x01"),), (bytearray(b"\xff"),)], "data binary")
    assert pub.publish_dataframe(topic, df) == 2
    rows = read_table(f"{warehouse}/messages").to_pylist()
    assert sorted(r["data"] for r in rows) == [b"\x00\x01", b"\xff"]
    assert all(r["size_bytes"] == len(r["data"]) for r in rows)


@pytest.mark.parametrize(
    "rows, schema, field",
    [
        ([("x", 1)], "data string, extra int", "dataframe"),
        ([(1,)], "data int", "dataframe.data"),
        ([("x",)], "payload string", "dataframe"),
        ([("x", {"k": 1})], "data string, attributes map<string,int>", "dataframe.attributes"),
        ([("x", {"goog-x": "v"})], "data string, attributes map<string,string>", "dataframe.attributes[row 0]['goog-x']"),
        ([("x", None), ("", None)], "data string, attributes map<string,string>", "dataframe[row 1]"),
        ([("x", 5)], "data string, ordering_key int", "dataframe.ordering_key"),
    ],
)
def test_bad_dataframes_write_nothing(spark, pub, topic, warehouse, rows, schema, field):
    before = table_versions(warehouse)
    with pytest.raises(InvalidArgument) as e:
        pub.publish_dataframe(topic, spark.createDataFrame(rows, schema))
    assert e.value.field == field
    assert table_versions(warehouse) == before


def test_dataframe_to_missing_topic(spark, pub):
    with pytest.raises(NotFound):
        pub.publish_dataframe("projects/local/topics/missing", spark.createDataFrame([("x",)], "data string"))
