"""export_table: a Delta export's columns and its idempotent append, on real Delta tables in temp dirs."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from deltabus.push import export_table as et
from deltabus.types import DeltaConfig, PubsubMessage, ReceivedMessage

SUB = "projects/p/subscriptions/exp"
WHEN = dt.datetime(2026, 11, 27, 6, 0, tzinfo=dt.timezone.utc)


def received(n: int, start: int = 0) -> list[ReceivedMessage]:
    return [ReceivedMessage(ack_id=f"a{i}", delivery_attempt=1,
                            message=PubsubMessage(data=f"d{i}".encode(), attributes={"i": str(i)}, message_id=f"m{i}",
                                                  publish_time=WHEN, ordering_key="k"))
            for i in range(start, start + n)]


def test_pubsubs_bigquery_metadata_columns_with_write_metadata_and_only_data_without():
    assert et.schema_for(DeltaConfig("/t")).names == ["data"]
    meta = et.schema_for(DeltaConfig("/t", write_metadata=True))
    assert meta.names == ["subscription_name", "message_id", "publish_time", "data", "attributes"]
    assert meta.field("attributes").type == pa.map_(pa.string(), pa.string())
    rows = et.rows_for(DeltaConfig("/t", write_metadata=True), SUB, received(2)).to_pylist()
    assert rows[1] == {"subscription_name": SUB, "message_id": "m1", "publish_time": WHEN, "data": b"d1", "attributes": [("i", "1")]}


def test_a_missing_table_is_created_and_a_batch_version_is_appended_once(tmp_path):
    cfg = DeltaConfig(str(tmp_path / "out"), write_metadata=True)
    rows = et.rows_for(cfg, SUB, received(3))
    assert et.committed_version(cfg.table, "app") is None
    assert et.append_once(cfg, rows, "app", 1) is True
    assert et.append_once(cfg, rows, "app", 1) is False  # a retry of batch 1: skipped
    assert et.append_once(cfg, et.rows_for(cfg, SUB, received(2, 3)), "app", 2) is True
    assert et.committed_version(cfg.table, "app") == 2
    got = DeltaTable(cfg.table).to_pyarrow_table()
    assert sorted(got["message_id"].to_pylist()) == [f"m{i}" for i in range(5)]
    assert pa.schema(DeltaTable(cfg.table).schema().to_arrow()).names == et.schema_for(cfg).names


def test_a_table_without_a_written_column_is_a_schema_mismatch_unless_drop_unknown_fields(tmp_path):
    table = str(tmp_path / "narrow")
    DeltaTable.create(table, pa.schema([pa.field("message_id", pa.string()), pa.field("data", pa.binary())]))
    cfg = DeltaConfig(table, write_metadata=True)
    with pytest.raises(et.ExportError) as e:
        et.append_once(cfg, et.rows_for(cfg, SUB, received(1)), "app", 1)
    assert e.value.reason == "schema mismatch" and "subscription_name" in e.value.detail
    assert DeltaTable(table).to_pyarrow_table().num_rows == 0  # nothing appended
    dropping = DeltaConfig(table, write_metadata=True, drop_unknown_fields=True)
    assert et.append_once(dropping, et.rows_for(dropping, SUB, received(1)), "app", 1)
    assert DeltaTable(table).to_pyarrow_table().to_pylist() == [{"message_id": "m0", "data": b"d0"}]


def test_a_column_of_another_type_is_a_schema_mismatch(tmp_path):
    table = str(tmp_path / "typed")
    DeltaTable.create(table, pa.schema([pa.field("data", pa.int64())]))
    with pytest.raises(et.ExportError) as e:
        et.append_once(DeltaConfig(table), et.rows_for(DeltaConfig(table), SUB, received(1)), "app", 1)
    assert e.value.reason == "schema mismatch" and "'data'" in e.value.detail


def test_a_string_attributes_column_gets_pubsubs_json_and_extra_nullable_columns_get_null(tmp_path):
    table = str(tmp_path / "json")
    DeltaTable.create(table, pa.schema([
        pa.field("subscription_name", pa.string()), pa.field("message_id", pa.string()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")), pa.field("data", pa.binary()),
        pa.field("attributes", pa.string()), pa.field("landed_by", pa.string())]))
    cfg = DeltaConfig(table, write_metadata=True)
    assert et.append_once(cfg, et.rows_for(cfg, SUB, received(1)), "app", 1)
    (row,) = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert json.loads(row["attributes"]) == {"i": "0"} and row["landed_by"] is None


def test_a_required_column_deltabus_does_not_write_is_a_schema_mismatch(tmp_path):
    table = str(tmp_path / "required")
    DeltaTable.create(table, pa.schema([pa.field("data", pa.binary()), pa.field("owner", pa.string(), nullable=False)]))
    with pytest.raises(et.ExportError) as e:
        et.append_once(DeltaConfig(table), et.rows_for(DeltaConfig(table), SUB, received(1)), "app", 1)
    assert e.value.reason == "schema mismatch" and "'owner'" in e.value.detail


@pytest.mark.parametrize("key, value", [(pa.string(), pa.int64()), (pa.int32(), pa.string())])
def test_a_map_attributes_column_must_be_string_to_string_and_no_value_reaches_the_error(tmp_path, key, value):
    """Before, map<string,int64> was accepted and Arrow's cast error (quoting the attribute
    value) became last_error; map<int,string> likewise."""
    table = str(tmp_path / "mapped")
    DeltaTable.create(table, pa.schema([pa.field("subscription_name", pa.string()), pa.field("message_id", pa.string()),
                                        pa.field("publish_time", pa.timestamp("us", tz="UTC")), pa.field("data", pa.binary()),
                                        pa.field("attributes", pa.map_(key, value))]))
    cfg = DeltaConfig(table, write_metadata=True)
    msg = ReceivedMessage(ack_id="a", delivery_attempt=1, message=PubsubMessage(
        data=b"x", attributes={"card": "4111-SECRET"}, message_id="m1", publish_time=WHEN))
    with pytest.raises(et.ExportError) as e:
        et.append_once(cfg, et.rows_for(cfg, SUB, [msg]), "app", 1)
    assert e.value.reason == "schema mismatch" and "'attributes'" in e.value.detail
    assert "SECRET" not in str(e.value) and "card" not in str(e.value)
    assert DeltaTable(table).to_pyarrow_table().num_rows == 0


def test_an_arrow_conversion_error_is_a_schema_mismatch_without_its_message():
    err = et._classify(pa.ArrowInvalid("Failed to parse string: '4111-SECRET' as a scalar of type int64"))
    assert err.reason == "schema mismatch" and "SECRET" not in str(err)


def test_a_path_that_cannot_be_a_directory_is_not_found(tmp_path):
    (tmp_path / "file").write_text("x")
    cfg = DeltaConfig(str(tmp_path / "file" / "t"))
    with pytest.raises(et.ExportError) as e:
        et.append_once(cfg, et.rows_for(cfg, SUB, received(1)), "app", 1)
    assert e.value.reason == "not found" and "\n" not in str(e.value)
