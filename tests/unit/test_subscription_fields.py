"""The one declaration of a subscription's fields, and what is checked against it.

``types.Subscription``, ``SubscriptionRecord`` and ``create_subscription``'s keyword
arguments are written out by hand (users and type checkers read them): these tests fail
when one of them disagrees with ``subscription_fields.COLUMNS``.
"""

from __future__ import annotations

import dataclasses
import inspect

import pyarrow as pa
import pytest

from deltabus import cli, subscription_fields as sf
from deltabus.errors import FailedPrecondition, InvalidArgument
from deltabus.registry import SubscriptionRecord, _sub_from_row, _sub_row
from deltabus.spark.sql import VIEWS
from deltabus.storage.tables import ALL, BACKLOG, SCHEMA_VERSION_KEY, SUBSCRIPTIONS, TableSpec, plan_migration, recorded_version
from deltabus.subscriber import client
from deltabus.types import PushConfig, Subscription

INTERNAL = [c.name for c in sf.COLUMNS if not c.public]


def test_subscription_type_has_exactly_the_public_fields_in_order_with_their_defaults():
    declared = [c.name for c in sf.PUBLIC]
    assert [f.name for f in dataclasses.fields(Subscription)] == declared
    for f in dataclasses.fields(Subscription):
        c = sf.BY_NAME[f.name]
        if c.required:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
        else:
            assert c.default is not None
            given = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert given == c.default(), f.name


def test_the_record_is_the_public_fields_plus_the_internal_columns():
    assert {f.name for f in dataclasses.fields(SubscriptionRecord)} == {c.name for c in sf.COLUMNS}
    assert issubclass(SubscriptionRecord, Subscription)
    assert INTERNAL == ["sub_uid", "topic_uid", "start_version", "create_time", "update_time", "last_active"]


def test_create_subscription_keywords_are_settable_fields():
    # Every settable field goes in `request`; the keywords are a fixed few of them (as
    # google-cloud-pubsub flattens only some fields), today's six.
    params = inspect.signature(client.SubscriberClient.create_subscription).parameters
    keywords = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keywords == ["name", "topic", "push_config", "ack_deadline_seconds", "labels", "enable_message_ordering"]
    assert set(keywords) <= {c.name for c in sf.SETTABLE}


def test_updatable_fields_come_from_the_declaration():
    assert client._UPDATABLE == set(sf.UPDATABLE)
    assert {"ack_deadline_seconds", "push_config", "labels"} <= client._UPDATABLE


def test_table_schema_and_versions_are_derived():
    assert SUBSCRIPTIONS.schema == pa.schema([c.arrow_field for c in sf.COLUMNS])
    assert SUBSCRIPTIONS.version == max(c.since for c in sf.COLUMNS)
    for version, layer in enumerate(SUBSCRIPTIONS.layers, 1):
        assert [f.name for f in layer] == [c.name for c in sf.COLUMNS if c.since == version]
    # Round 1's layout, as the tables on disk have it.
    assert SUBSCRIPTIONS.layers[0] == tuple(SUBSCRIPTIONS.schema)[:11]


def test_sql_view_shows_the_public_fields():
    view = VIEWS["subscriptions"]
    for c in sf.PUBLIC:
        assert (f"s.{c.name}" in view) or c.name in ("name", "topic"), c.name
    for name in ("sub_uid", "topic_uid", "start_version"):
        assert f"s.{name}," not in view and f"s.{name}\n" not in view


def test_cli_has_a_flag_for_every_field_that_declares_one(capsys):
    cli.main(["subscriptions", "create", "--help"])
    create_help = capsys.readouterr().out
    cli.main(["subscriptions", "update", "--help"])
    update_help = capsys.readouterr().out
    for c in sf.WITH_FLAG:
        assert c.cli is not None and c.cli.flag in create_help
        assert (c.cli.flag in update_help) == c.updatable
    parser = cli.build_parser()
    create = parser.parse_args(["subscriptions", "create", "s", "--topic", "t", "--ack-deadline", "20", "--label", "a=b"])
    assert cli._field_flag_values(create) == {"ack_deadline_seconds": 20, "labels": {"a": "b"}}
    update = parser.parse_args(["subscriptions", "update", "s", "--label", "a=b"])
    assert cli._field_flag_values(update) == {"labels": {"a": "b"}}


def record(**changes: object) -> SubscriptionRecord:
    base = SubscriptionRecord(
        name="projects/p/subscriptions/s", topic="projects/p/topics/t",
        push_config=PushConfig("https://example.com/push", {"x-goog-version": "v1"}),
        ack_deadline_seconds=42, labels={"team": "data"}, enable_message_ordering=True,
        sub_uid="s1", topic_uid="t1", start_version=7,
    )
    return dataclasses.replace(base, **changes)


def test_rows_round_trip_through_the_table_schema():
    rec = record()
    table = pa.Table.from_pylist([_sub_row(rec)], schema=SUBSCRIPTIONS.schema)
    assert _sub_from_row(table.to_pylist()[0]) == rec


def test_a_row_older_than_a_column_reads_its_default():
    row = _sub_row(record())
    for name in ("labels", "enable_message_ordering", "ack_deadline_seconds", "push_config"):
        row.pop(name)
    got = _sub_from_row(row)
    assert (dict(got.labels), got.enable_message_ordering, got.ack_deadline_seconds, got.push_config) == ({}, False, 10, PushConfig())


def test_public_view_copies_dicts_and_hides_a_deleted_topic():
    rec = record()
    shown = rec.public(topic_live=False)
    assert type(shown) is Subscription and shown.topic == "_deleted-topic_"
    shown.labels["team"] = "changed"  # type: ignore[index]
    assert rec.labels == {"team": "data"}


def test_create_settings_validates_in_declaration_order_and_fills_defaults():
    got = sf.create_settings({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"})
    assert got == Subscription("projects/p/subscriptions/sub", "projects/p/topics/top")
    with pytest.raises(InvalidArgument) as e:
        sf.create_settings({"topic": "projects/p/topics/top"})
    assert e.value.field == "name"
    with pytest.raises(InvalidArgument) as e:
        sf.create_settings({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top",
                            "ack_deadline_seconds": 5, "labels": {"BAD": "x"}})
    assert e.value.field == "ack_deadline_seconds"
    with pytest.raises(InvalidArgument) as e:
        sf.create_settings({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top",
                            "enable_message_ordering": None})
    assert (e.value.field, e.value.rule) == ("enable_message_ordering", "must be a boolean")


def test_a_callers_check_runs_on_its_field():
    def no_push(value: PushConfig) -> PushConfig:
        if value.is_push:
            raise InvalidArgument("push_config.push_endpoint", "not here")
        return value

    given = {"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top", "push_config": {"push_endpoint": "https://a.example/p"}}
    with pytest.raises(InvalidArgument, match="not here"):
        sf.create_settings(given, {"push_config": no_push})


def test_update_changes_name_the_subscription_field():
    assert sf.update_changes({"labels": {"a": "b"}}, ["labels"]) == {"labels": {"a": "b"}}
    with pytest.raises(InvalidArgument) as e:
        sf.update_changes({"ack_deadline_seconds": 1000}, ["ack_deadline_seconds"])
    assert e.value.field == "subscription.ack_deadline_seconds"


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        ({"since": 2, "nullable": False, "default": str, "validate": lambda v, p: v}, "must be nullable"),
        ({"updatable": True, "settable": False, "default": str}, "must be settable"),
        ({"public": False, "validate": lambda v, p: v}, "only public fields are settable"),
        ({"default": str}, "needs a validator"),
        ({"validate": lambda v, p: v}, "needs a default"),
        ({"since": 0, "default": str, "validate": lambda v, p: v}, "since is a schema version"),
    ],
)
def test_a_bad_declaration_is_refused_when_the_module_loads(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        sf.SubscriptionField("x", pa.string(), **kwargs)


# -- table versions (pure parts) -----------------------------------------------------------------
def test_every_table_records_its_version_and_later_columns_are_nullable():
    for spec in ALL:
        assert spec.properties[SCHEMA_VERSION_KEY] == str(spec.version)
        assert all(f.nullable for layer in spec.layers[1:] for f in layer)
    assert BACKLOG.version == 3 and [f.name for f in BACKLOG.layers[1]] == ["backoff_until", "backoff_reason", "last_status", "last_error"]
    assert [f.name for f in BACKLOG.layers[2]] == ["dead_lettered", "dead_letter_blocked"]  # issue 13
    with pytest.raises(ValueError, match="must be nullable"):
        TableSpec("t", ((pa.field("a", pa.string()),), (pa.field("b", pa.string(), nullable=False),)))


def test_plan_migration():
    v1 = BACKLOG.layers[0]
    names = [f.name for f in v1]
    plan = plan_migration(BACKLOG, names, {})
    # Backlog is at version 3 since issue 13's dead-letter figures (2 before).
    assert plan is not None and plan.from_version == 1 and plan.to_version == 3 and plan.set_version
    assert [f.name for f in plan.add] == [f.name for layer in BACKLOG.layers[1:] for f in layer]
    assert plan_migration(BACKLOG, BACKLOG.schema.names, {SCHEMA_VERSION_KEY: "3"}) is None
    stamp = plan_migration(BACKLOG, BACKLOG.schema.names, {})  # columns there, version never recorded
    assert stamp is not None and stamp.add == () and stamp.set_version
    assert recorded_version(BACKLOG, {}) == 1
    with pytest.raises(FailedPrecondition, match="newer deltabus"):
        plan_migration(BACKLOG, names, {SCHEMA_VERSION_KEY: "4"})


# -- Delta export (issue 17) ------------------------------------------------------------------
def test_delta_config_is_a_version_6_updatable_column_that_round_trips_through_a_row():
    from deltabus.types import DeltaConfig

    c = sf.BY_NAME["delta_config"]
    assert c.since == 6 and c.updatable and c.nullable and c.default() is None
    assert SUBSCRIPTIONS.version == 6
    cfg = DeltaConfig("/data/out", write_metadata=True)
    assert c.load(c.store(cfg)) == cfg
    assert c.load(None) is None  # a row older than the column: no export


@pytest.mark.parametrize(
    "value, field, rule",
    [
        ({"table": "relative/path"}, "delta_config.table", "absolute path or a URI"),
        ({"table": "/a b"}, "delta_config.table", "whitespace"),
        ({"table": "/" + "x" * 5000}, "delta_config.table", "at most 4096"),
        ({"table": "/t", "write_metadata": "yes"}, "delta_config.write_metadata", "boolean"),
        ({"table": "", "write_metadata": True}, "delta_config.table", "required"),
        ({"table": "/t", "partition": "x"}, "delta_config", "unknown fields"),
        ("/t", "delta_config", "must be a DeltaConfig"),
    ],
)
def test_a_bad_delta_config_names_the_field_and_rule(value, field, rule):
    with pytest.raises(InvalidArgument) as e:
        sf.create_settings({"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top", "delta_config": value})
    assert e.value.field == field and rule in e.value.rule


def test_an_empty_delta_config_is_no_export_and_a_uri_is_accepted():
    base = {"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"}
    assert sf.create_settings({**base, "delta_config": {}}).delta_config is None
    assert sf.create_settings({**base, "delta_config": {"table": "s3://bucket/t"}}).delta_config.table == "s3://bucket/t"


def test_push_and_delta_export_are_mutually_exclusive():
    base = {"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"}
    both = sf.create_settings({**base, "delta_config": {"table": "/t"}, "push_config": {"push_endpoint": "https://a.example/p"}})
    with pytest.raises(InvalidArgument) as e:
        sf.check_delivery_kind(both)
    assert e.value.field == "delta_config" and "either push" in e.value.rule
    sf.check_delivery_kind(sf.create_settings({**base, "delta_config": {"table": "/t"}}))  # export alone: fine


def test_a_delta_export_cannot_enable_exactly_once_delivery_as_pubsubs_export_subscriptions():
    base = {"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top", "delta_config": {"table": "/t"}}
    with pytest.raises(InvalidArgument) as e:
        sf.check_exactly_once(sf.create_settings({**base, "enable_exactly_once_delivery": True}))
    assert e.value.field == "enable_exactly_once_delivery" and "Delta export" in e.value.rule
    sf.check_exactly_once(sf.create_settings(base))
