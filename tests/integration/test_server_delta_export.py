"""Delta export subscriptions (issue 17) through `deltabus serve` and the REAL google-cloud-pubsub
client: Pub/Sub's ``bigquery_config`` is deltabus's ``delta_config`` (its ``table`` a Delta
path or URI), so admin code that creates BigQuery subscriptions works unchanged."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc
from google.pubsub_v1 import types as pb

from deltabus import SubscriberClient
from deltabus.types import DeltaConfig
from tests.conftest import table_versions
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

T = f"projects/{PROJECT}/topics/orders"
S = f"projects/{PROJECT}/subscriptions/orders-export"


def test_bigquery_config_creates_gets_updates_and_clears_a_delta_export(gpub, gsub, warehouse: str, tmp_path) -> None:
    gpub.create_topic(name=T)
    table = str(tmp_path / "landed")
    made = gsub.create_subscription(request={"name": S, "topic": T, "bigquery_config": {"table": table, "write_metadata": True}})
    assert made.bigquery_config.table == table and made.bigquery_config.write_metadata
    assert made.bigquery_config.state == pb.BigQueryConfig.State.ACTIVE
    # What the library (and so the push job) sees:
    assert SubscriberClient(warehouse=warehouse).get_subscription(subscription=S).delta_config == DeltaConfig(table, True, False)

    updated = gsub.update_subscription(request={
        "subscription": {"name": S, "bigquery_config": {"table": table, "drop_unknown_fields": True}},
        "update_mask": {"paths": ["bigquery_config"]}})
    assert not updated.bigquery_config.write_metadata and updated.bigquery_config.drop_unknown_fields
    assert gsub.get_subscription(subscription=S).bigquery_config.drop_unknown_fields

    cleared = gsub.update_subscription(request={"subscription": {"name": S}, "update_mask": {"paths": ["bigquery_config"]}})
    assert "bigquery_config" not in cleared  # a pull subscription again
    assert SubscriberClient(warehouse=warehouse).get_subscription(subscription=S).delta_config is None


def test_bad_bigquery_configs_are_invalid_argument_naming_the_field_and_write_nothing(gpub, gsub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    before = table_versions(warehouse)
    with pytest.raises(gexc.InvalidArgument, match=r"bigquery_config\.table.*absolute path or a URI"):
        gsub.create_subscription(request={"name": S, "topic": T, "bigquery_config": {"table": "project.dataset.table"}})
    with pytest.raises(gexc.InvalidArgument, match=r"bigquery_config\.use_topic_schema"):
        gsub.create_subscription(request={"name": S, "topic": T, "bigquery_config": {"table": "/t", "use_topic_schema": True}})
    with pytest.raises(gexc.InvalidArgument, match=r"bigquery_config.*either push"):
        gsub.create_subscription(request={"name": S, "topic": T, "bigquery_config": {"table": "/t"},
                                          "push_config": {"push_endpoint": "https://example.com/push"}})
    assert table_versions(warehouse) == before
    with pytest.raises(gexc.NotFound):
        gsub.get_subscription(subscription=S)
    # A push subscription cannot take an export through an update either.
    gsub.create_subscription(request={"name": S, "topic": T, "push_config": {"push_endpoint": "https://example.com/push"}})
    with pytest.raises(gexc.InvalidArgument, match=r"subscription\.bigquery_config"):
        gsub.update_subscription(request={"subscription": {"name": S, "bigquery_config": {"table": "/t"}},
                                          "update_mask": {"paths": ["bigquery_config"]}})
    assert not gsub.get_subscription(subscription=S).bigquery_config.table


def test_the_state_shows_a_table_the_push_job_cannot_write(gpub, gsub, warehouse: str, tmp_path) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable

    from deltabus import config
    from deltabus.push.job import DeliveryJob

    table = str(tmp_path / "typed")
    DeltaTable.create(table, pa.schema([pa.field("data", pa.int64())]))  # deltabus writes binary data
    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "bigquery_config": {"table": table}})
    gpub.publish(T, b"x").result()
    assert gsub.get_subscription(subscription=S).bigquery_config.state == pb.BigQueryConfig.State.ACTIVE  # nothing tried yet
    job = DeliveryJob(None, config.Settings(warehouse=warehouse, engine="delta-rs", backlog_interval=0.0))  # type: ignore[arg-type]
    try:
        job.process(None, 1)
    finally:
        job.close()
    assert gsub.get_subscription(subscription=S).bigquery_config.state == pb.BigQueryConfig.State.SCHEMA_MISMATCH
    (listed,) = gsub.list_subscriptions(project=f"projects/{PROJECT}")
    assert listed.bigquery_config.state == pb.BigQueryConfig.State.SCHEMA_MISMATCH


def test_pull_and_streaming_pull_on_an_export_subscription_are_failed_precondition(gpub, gsub, warehouse: str, tmp_path) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(request={"name": S, "topic": T, "bigquery_config": {"table": str(tmp_path / "t")}})
    gpub.publish(T, b"x").result()
    with pytest.raises(gexc.FailedPrecondition, match="Delta export subscription"):
        gsub.pull(request={"subscription": S, "max_messages": 10})
    future = gsub.subscribe(S, lambda m: m.ack())
    with pytest.raises(gexc.FailedPrecondition, match="Delta export subscription"):
        future.result(timeout=30)
    assert SubscriberClient(warehouse=warehouse).get_backlog(S).num_unacked_messages == 1
