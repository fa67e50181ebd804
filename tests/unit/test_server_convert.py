"""convert: proto-plus google.pubsub_v1 messages <-> deltabus records and request dicts."""

from __future__ import annotations

import datetime as dt

import pytest
from google.pubsub_v1 import types as pb

from deltabus.errors import InvalidArgument
from deltabus.server import convert
from deltabus.types import DeadLetterPolicy, NoWrapper, OidcToken, PushConfig, RetryPolicy, Snapshot, Subscription, Topic

T = "projects/p/topics/top1"
S = "projects/p/subscriptions/sub1"
N = "projects/p/snapshots/snap1"


def test_topic_both_ways() -> None:
    assert convert.topic_request(pb.Topic(name=T, labels={"a": "b"})) == {"name": T, "labels": {"a": "b"}}
    assert convert.topic_to_proto(Topic(T, {"a": "b"})) == pb.Topic(name=T, labels={"a": "b"})


def test_an_unsupported_topic_field_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument) as e:
        convert.topic_request(pb.Topic(name=T, kms_key_name="k"))
    assert e.value.field == "topic.kms_key_name"
    # output-only fields are ignored
    assert convert.topic_request(pb.Topic(name=T, satisfies_pzs=True)) == {"name": T, "labels": {}}


def test_create_values_only_what_is_set() -> None:
    """Proto3 defaults are "not given": ack_deadline_seconds 0 is Pub/Sub's default (10 s)."""
    assert convert.subscription_values(pb.Subscription(name=S, topic=T)) == {"name": S, "topic": T}


def test_create_values_of_every_supported_field() -> None:
    sub = pb.Subscription(
        name=S, topic=T, ack_deadline_seconds=30, labels={"k": "v"}, enable_message_ordering=True, filter='attributes:x',
        push_config=pb.PushConfig(
            push_endpoint="https://h/p", attributes={"x-goog-version": "v1"},
            oidc_token=pb.PushConfig.OidcToken(service_account_email="a@b.c", audience="aud"),
            no_wrapper=pb.PushConfig.NoWrapper(write_metadata=True),
        ),
        retry_policy=pb.RetryPolicy(minimum_backoff=dt.timedelta(seconds=5)),
        dead_letter_policy=pb.DeadLetterPolicy(dead_letter_topic=T),
    )
    v = convert.subscription_values(sub)
    assert v["ack_deadline_seconds"] == 30 and v["labels"] == {"k": "v"} and v["enable_message_ordering"] is True
    assert v["filter"] == "attributes:x"
    assert v["push_config"] == {
        "push_endpoint": "https://h/p", "attributes": {"x-goog-version": "v1"},
        "oidc_token": {"service_account_email": "a@b.c", "audience": "aud"}, "no_wrapper": {"write_metadata": True},
    }
    assert v["retry_policy"] == {"minimum_backoff": 5.0, "maximum_backoff": None}  # unset: the library's default
    assert RetryPolicy.coerce(v["retry_policy"]) == RetryPolicy(5, 600)
    assert v["dead_letter_policy"] == {"dead_letter_topic": T, "max_delivery_attempts": 0}
    assert DeadLetterPolicy.coerce(v["dead_letter_policy"]) == DeadLetterPolicy(T, 5)


@pytest.mark.parametrize(
    "field, value",
    # bigquery_config is deltabus's Delta export (issue 17): tests/integration/test_server_delta_export.py.
    [("cloud_storage_config", pb.CloudStorageConfig(bucket="b")), ("tags", {"k": "v"})],
)
def test_an_unsupported_subscription_field_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument) as e:
        convert.subscription_values(pb.Subscription(name=S, topic=T, **{field: value}))
    assert e.value.field == f"subscription.{field}" and "not supported" in e.value.rule


def test_exactly_once_converts_both_ways() -> None:
    """Create: given only when set; update: a masked path left unset turns it off; out: as stored."""
    assert convert.subscription_values(pb.Subscription(name=S, topic=T, enable_exactly_once_delivery=True)) == {
        "name": S, "topic": T, "enable_exactly_once_delivery": True}
    assert "enable_exactly_once_delivery" not in convert.subscription_values(pb.Subscription(name=S, topic=T))
    masked = ["enable_exactly_once_delivery"]
    assert convert.subscription_values(pb.Subscription(name=S, enable_exactly_once_delivery=True), masked) == {
        "enable_exactly_once_delivery": True}
    assert convert.subscription_values(pb.Subscription(name=S), masked) == {"enable_exactly_once_delivery": False}
    assert convert.subscription_to_proto(Subscription(name=S, topic=T, enable_exactly_once_delivery=True)).enable_exactly_once_delivery
    assert not convert.subscription_to_proto(Subscription(name=S, topic=T)).enable_exactly_once_delivery


def test_retention_fields_convert_both_ways() -> None:
    v = convert.subscription_values(
        pb.Subscription(name=S, topic=T, retain_acked_messages=True, message_retention_duration=dt.timedelta(hours=2))
    )
    assert v["retain_acked_messages"] is True and v["message_retention_duration"] == 7200.0
    assert "message_retention_duration" not in convert.subscription_values(pb.Subscription(name=S, topic=T))
    out = convert.subscription_to_proto(Subscription(name=S, topic=T, message_retention_duration=7200.0, retain_acked_messages=True))
    assert out.retain_acked_messages and out.message_retention_duration == dt.timedelta(hours=2)
    topic = convert.topic_request(pb.Topic(name=T, message_retention_duration=dt.timedelta(days=2)))
    assert topic["message_retention_duration"] == 2 * 86400.0
    assert "message_retention_duration" not in convert.topic_request(pb.Topic(name=T))
    assert convert.topic_to_proto(Topic(name=T, message_retention_duration=600.0)).message_retention_duration == dt.timedelta(minutes=10)


def test_a_subscription_is_not_created_detached() -> None:
    with pytest.raises(InvalidArgument) as e:
        convert.subscription_values(pb.Subscription(name=S, topic=T, detached=True))
    assert e.value.field == "subscription.detached" and "DetachSubscription" in e.value.rule
    assert convert.subscription_to_proto(Subscription(name=S, topic=T, detached=True)).detached
    assert not convert.subscription_to_proto(Subscription(name=S, topic=T)).detached


def test_update_values_follow_the_mask() -> None:
    """A masked field left unset clears it (None, or the default); unmasked fields are not read."""
    sub = pb.Subscription(name=S, ack_deadline_seconds=20, labels={"a": "b"})
    assert convert.subscription_values(sub, ["labels"]) == {"labels": {"a": "b"}}
    assert convert.subscription_values(sub, ["retry_policy", "dead_letter_policy", "push_config"]) == {
        "retry_policy": None, "dead_letter_policy": None, "push_config": {}}
    assert convert.subscription_values(pb.Subscription(name=S), ["ack_deadline_seconds"]) == {"ack_deadline_seconds": 10}
    # a path deltabus cannot update is passed on for the client to refuse by name
    assert convert.subscription_values(sub, ["detached"]) == {"detached": None}


def test_subscription_to_proto() -> None:
    sub = Subscription(
        name=S, topic=T, push_config=PushConfig("https://h/p", {"a": "b"}, OidcToken("a@b.c", "x"), NoWrapper(True)),
        ack_deadline_seconds=42, labels={"l": "v"}, enable_message_ordering=True,
        retry_policy=RetryPolicy(1.5, 20), dead_letter_policy=DeadLetterPolicy(T, 7), filter="attributes:k",
    )
    p = convert.subscription_to_proto(sub)
    assert (p.name, p.topic, p.ack_deadline_seconds, dict(p.labels), p.enable_message_ordering, p.filter) == (
        S, T, 42, {"l": "v"}, True, "attributes:k")
    assert p.push_config.push_endpoint == "https://h/p" and p.push_config.oidc_token.audience == "x"
    assert p.push_config.no_wrapper.write_metadata is True
    assert p.retry_policy.minimum_backoff == dt.timedelta(seconds=1.5)
    assert p.dead_letter_policy.max_delivery_attempts == 7
    # and back: the create request of what GetSubscription shows is the same subscription
    assert Subscription.coerce({k: v for k, v in convert.subscription_values(p).items()}).push_config == sub.push_config
    bare = convert.subscription_to_proto(Subscription(name=S, topic=T))
    assert "retry_policy" not in bare and "dead_letter_policy" not in bare


def test_message_and_received() -> None:
    m = pb.PubsubMessage(data=b"x", attributes={"k": "v"}, ordering_key="o", message_id="ignored")
    assert convert.message_request(m) == {"data": b"x", "attributes": {"k": "v"}, "ordering_key": "o"}
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678000)  # naive: UTC
    r = convert.received_to_proto("ack", b"d", {"a": "b"}, "id1", when, "", 3)
    assert r.ack_id == "ack" and r.delivery_attempt == 3 and r.message.message_id == "id1"
    assert r.message.publish_time == when.replace(tzinfo=dt.timezone.utc)


def test_mask_paths_need_one() -> None:
    with pytest.raises(InvalidArgument) as e:
        convert.mask_paths(None)
    assert e.value.field == "update_mask"
    assert convert.mask_paths(pb.UpdateTopicRequest(update_mask={"paths": ["labels"]}).update_mask) == ["labels"]


def test_unknown_field_numbers_are_refused_by_path() -> None:
    ok = pb.PublishRequest(topic=T, messages=[pb.PubsubMessage(data=b"a", attributes={"k": "v"})])
    convert.refuse_unknown_fields(pb.PublishRequest.deserialize(pb.PublishRequest.serialize(ok)))
    inner = pb.PubsubMessage.serialize(pb.PubsubMessage(data=b"a")) + b"\xa0\x06\x01"  # field 100, varint 1
    raw = pb.PublishRequest.serialize(pb.PublishRequest(topic=T)) + b"\x12" + bytes([len(inner)]) + inner
    with pytest.raises(InvalidArgument) as e:
        convert.refuse_unknown_fields(pb.PublishRequest.deserialize(raw))
    assert e.value.field == "messages[0].#100"
    with pytest.raises(InvalidArgument) as e:
        convert.refuse_unknown_fields(pb.GetTopicRequest.deserialize(b"\xa0\x06\x01"))
    assert e.value.field == "#100"


# -- seek and snapshots (issue 15) ----------------------------------------------------------------
def test_seek_request_reads_the_one_target() -> None:
    from google.protobuf import timestamp_pb2

    raw = pb.SeekRequest.pb(pb.SeekRequest(subscription=S))
    raw.time.CopyFrom(timestamp_pb2.Timestamp(seconds=1_790_000_000, nanos=123_456_789))
    assert convert.seek_request(pb.SeekRequest.wrap(raw)) == {
        "subscription": S, "time": {"seconds": 1_790_000_000, "nanos": 123_456_789}}  # to the nanosecond
    assert convert.seek_request(pb.SeekRequest(subscription=S, snapshot=N)) == {"subscription": S, "snapshot": N}
    with pytest.raises(InvalidArgument) as e:
        convert.seek_request(pb.SeekRequest(subscription=S))
    assert e.value.field == "target" and "time" in e.value.rule and "snapshot" in e.value.rule
    with pytest.raises(InvalidArgument) as e:
        convert.seek_request(pb.SeekRequest(subscription=S, snapshot=""))  # set, but empty
    assert e.value.field == "snapshot"


def test_create_snapshot_request_refuses_tags() -> None:
    req = pb.CreateSnapshotRequest(name=N, subscription=S, labels={"a": "b"})
    assert convert.create_snapshot_request(req) == {"name": N, "subscription": S, "labels": {"a": "b"}}
    with pytest.raises(InvalidArgument) as e:
        convert.create_snapshot_request(pb.CreateSnapshotRequest(name=N, subscription=S, tags={"k": "v"}))
    assert e.value.field == "tags"


def test_snapshot_update_takes_labels_only() -> None:
    req = pb.UpdateSnapshotRequest(snapshot=pb.Snapshot(name=N, labels={"a": "b"}, topic=T), update_mask={"paths": ["labels"]})
    assert convert.snapshot_update(req) == {"snapshot": {"name": N, "labels": {"a": "b"}}, "update_mask": ["labels"]}
    for paths, words in ((["expire_time"], "expire_time"), (["labels", "topic"], "topic"), ([], "at least one")):
        with pytest.raises(InvalidArgument) as e:
            convert.snapshot_update(pb.UpdateSnapshotRequest(snapshot=pb.Snapshot(name=N), update_mask={"paths": paths}))
        assert e.value.field == "update_mask" and words in e.value.rule


def test_snapshot_to_proto() -> None:
    when = dt.datetime(2026, 12, 3, 4, 5, 6, tzinfo=dt.timezone.utc)
    out = convert.snapshot_to_proto(Snapshot(name=N, topic=T, expire_time=when, labels={"a": "b"}))
    assert out == pb.Snapshot(name=N, topic=T, expire_time=when, labels={"a": "b"})
    assert convert.snapshot_to_proto(Snapshot(name=N, topic=T, expire_time=when.replace(tzinfo=None))).expire_time == when
    assert "expire_time" not in convert.snapshot_to_proto(Snapshot(name=N, topic=T))


# -- bigquery_config is deltabus's Delta export (issue 17) ----------------------------------------
def test_bigquery_config_becomes_delta_config_and_back() -> None:
    sub = pb.Subscription(name=S, topic=T, bigquery_config=pb.BigQueryConfig(table="/data/t", write_metadata=True))
    v = convert.subscription_values(sub)
    assert v["delta_config"] == {"table": "/data/t", "write_metadata": True, "drop_unknown_fields": False}
    assert "bigquery_config" not in v
    from deltabus.types import DeltaConfig

    out = convert.subscription_to_proto(Subscription(S, T, delta_config=DeltaConfig("/data/t", True, True)))
    assert out.bigquery_config.table == "/data/t" and out.bigquery_config.write_metadata
    assert out.bigquery_config.drop_unknown_fields and out.bigquery_config.state == pb.BigQueryConfig.State.ACTIVE
    assert "bigquery_config" not in convert.set_fields(convert.subscription_to_proto(Subscription(S, T)))


def test_an_unsupported_bigquery_config_field_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument) as e:
        convert.subscription_values(pb.Subscription(name=S, topic=T, bigquery_config=pb.BigQueryConfig(table="/t", use_topic_schema=True)))
    assert e.value.field == "subscription.bigquery_config.use_topic_schema"
    # state is output only: ignored
    sub = pb.Subscription(name=S, topic=T, bigquery_config=pb.BigQueryConfig(table="/t", state=pb.BigQueryConfig.State.ACTIVE))
    assert convert.subscription_values(sub)["delta_config"]["table"] == "/t"


def test_an_update_mask_naming_bigquery_config_updates_delta_config() -> None:
    paths = ["bigquery_config", "labels"]
    v = convert.subscription_values(pb.Subscription(name=S), paths)
    assert v["delta_config"] is None  # unset: the export is removed
    assert convert.update_paths(paths) == ["delta_config", "labels"]


def test_errors_name_bigquery_config_on_the_wire() -> None:
    e = convert.api_field_names(InvalidArgument("delta_config.table", "must be an absolute path"))
    assert e.field == "bigquery_config.table"
    e = convert.api_field_names(InvalidArgument("subscription.delta_config", "x"))
    assert e.field == "subscription.bigquery_config"
    e = convert.api_field_names(InvalidArgument("delta_config", "push (push_config.push_endpoint) or a Delta export (delta_config.table)"))
    assert e.field == "bigquery_config" and "bigquery_config.table" in e.rule
    other = InvalidArgument("labels", "bad")
    assert convert.api_field_names(other) is other


@pytest.mark.parametrize(
    "last_status, state",
    [(None, "ACTIVE"), ("delta ok", "ACTIVE"), ("delta error", "ACTIVE"), ("delta not found", "NOT_FOUND"),
     ("delta permission denied", "PERMISSION_DENIED"), ("delta schema mismatch", "SCHEMA_MISMATCH")],
)
def test_the_bigquery_config_state_follows_the_exports_last_outcome(last_status, state) -> None:
    from deltabus.types import DeltaConfig

    out = convert.subscription_to_proto(Subscription(S, T, delta_config=DeltaConfig("/t")), last_status)
    assert out.bigquery_config.state == pb.BigQueryConfig.State[state]
