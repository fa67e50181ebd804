"""proto-plus ``google.pubsub_v1.types`` <-> deltabus records and request dicts.

Inbound, a message becomes the dict the deltabus clients take (``request=``), so their
validation runs unchanged and errors name the API's fields. Proto3 leaves a field that was
never set at its default, so "given" means *set to a non-default value* (``set_fields``);
that is how Pub/Sub reads a request too (ack_deadline_seconds 0 is the default, 10 s).

A field deltabus does not implement (BigQuery/Cloud Storage export, KMS, schemas, message
transforms, ...) is refused with INVALID_ARGUMENT naming it when set, rather
than dropped: a program that asks for a feature must not believe it has it. Output-only
fields (``state``, ``satisfies_pzs``, ...) are ignored.

``bigquery_config`` (issue 17) carries deltabus's Delta export (``delta_config``): its
``table`` is a Delta table's absolute path or URI here, not a BigQuery table id, and
``write_metadata`` / ``drop_unknown_fields`` mean what they mean for BigQuery. So a Pub/Sub
user's admin code (Terraform, scripts) that creates BigQuery subscriptions works unchanged
with a Delta path. ``use_topic_schema``, ``use_table_schema`` and ``service_account_email``
are refused when set. ``state`` is output only: it follows the push job's latest outcome for
the export (the ``backlog`` table's ``last_status``: ``delta permission denied`` ->
PERMISSION_DENIED, ``delta not found`` -> NOT_FOUND, ``delta schema mismatch`` ->
SCHEMA_MISMATCH, anything else or none yet -> ACTIVE), as Pub/Sub's reflects its last write.

``enable_exactly_once_delivery`` (issue 15) is a plain boolean both ways; the library
refuses it on a push subscription (``subscription_fields.check_exactly_once``).

Outbound, deltabus records become proto-plus messages. ``delivery_attempt`` is filled only
for a subscription with a dead-letter policy, as Pub/Sub documents (0 otherwise).

Seek and snapshots (issue 15): ``seek_request`` reads the SeekRequest's oneof ``target``
(a time, kept to the nanosecond as ``{"seconds", "nanos"}``, or a snapshot name; neither:
INVALID_ARGUMENT naming ``target``); ``create_snapshot_request`` refuses ``tags``;
``snapshot_update`` accepts only the ``labels`` path (a snapshot's ``expire_time`` follows
from its oldest unacked message and cannot be set).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Mapping

from google.protobuf import timestamp_pb2, unknown_fields
from google.pubsub_v1 import types as pb

from ..errors import InvalidArgument
from ..types import PushConfig, Snapshot, Subscription, Topic

# Fields of the protos deltabus implements; the rest is refused when set.
TOPIC_FIELDS = frozenset({"name", "labels", "message_retention_duration"})
TOPIC_OUTPUT_ONLY = frozenset({"state", "satisfies_pzs"})
SUBSCRIPTION_FIELDS = frozenset(
    {"name", "topic", "push_config", "ack_deadline_seconds", "labels", "enable_message_ordering", "filter",
     "dead_letter_policy", "retry_policy", "expiration_policy", "message_retention_duration", "retain_acked_messages",
     "enable_exactly_once_delivery", "bigquery_config"}
)
BIGQUERY_CONFIG_FIELDS = frozenset({"table", "write_metadata", "drop_unknown_fields"})
BIGQUERY_CONFIG_OUTPUT_ONLY = frozenset({"state"})
SUBSCRIPTION_OUTPUT_ONLY = frozenset({"state", "topic_message_retention_duration", "analytics_hub_subscription_info"})
PUSH_CONFIG_FIELDS = frozenset({"push_endpoint", "attributes", "oidc_token", "pubsub_wrapper", "no_wrapper"})
CREATE_SNAPSHOT_FIELDS = frozenset({"name", "subscription", "labels"})
UPDATABLE_SNAPSHOT_FIELDS = ("labels",)


def set_fields(message: Any) -> list[str]:
    """Names of the fields of a proto-plus message that are set (non-default, or present)."""
    return [f.name for f, _ in type(message).pb(message).ListFields()]


def _unknown_field(message: Any, path: str) -> str | None:
    """The path of the first field number `message` (a protobuf message) does not declare."""
    unknown = unknown_fields.UnknownFieldSet(message)
    if len(unknown):
        return f"{path}.#{unknown[0].field_number}" if path else f"#{unknown[0].field_number}"
    for descriptor, value in message.ListFields():
        kind = descriptor.message_type
        if kind is None or kind.GetOptions().map_entry:
            continue
        name = f"{path}.{descriptor.name}" if path else descriptor.name
        items = enumerate(value) if descriptor.is_repeated else [(None, value)]
        for i, item in items:
            found = _unknown_field(item, name if i is None else f"{name}[{i}]")
            if found is not None:
                return found
    return None


def refuse_unknown_fields(request: Any) -> None:
    """InvalidArgument naming a field (by its number) that google.pubsub.v1 as this server
    knows it does not declare: a request it cannot read fully is not half-applied."""
    found = _unknown_field(type(request).pb(request), "")
    if found is not None:
        raise InvalidArgument(found, "unknown field number in google.pubsub.v1 as deltabus serve knows it")


def refuse_unsupported(message: Any, supported: Iterable[str], ignored: Iterable[str], where: str) -> None:
    """InvalidArgument naming the first set field deltabus does not implement."""
    allowed = set(supported) | set(ignored)
    for name in set_fields(message):
        if name not in allowed:
            raise InvalidArgument(f"{where}.{name}", "is not supported by deltabus serve (leave it unset)")


def _seconds(d: dt.timedelta) -> float:
    return d.total_seconds()


# -- topics -------------------------------------------------------------------------------
def topic_to_proto(topic: Topic) -> pb.Topic:
    extra: dict[str, Any] = {}
    if topic.message_retention_duration is not None:
        extra["message_retention_duration"] = dt.timedelta(seconds=topic.message_retention_duration)
    return pb.Topic(name=topic.name, labels=dict(topic.labels), **extra)


def topic_request(topic: pb.Topic, where: str = "topic") -> dict[str, Any]:
    """The create_topic request dict of a Topic (name, labels, message_retention_duration
    when set: unset is no topic retention)."""
    refuse_unsupported(topic, TOPIC_FIELDS, TOPIC_OUTPUT_ONLY, where)
    out: dict[str, Any] = {"name": topic.name, "labels": dict(topic.labels)}
    if "message_retention_duration" in set_fields(topic):
        out["message_retention_duration"] = _seconds(getattr(topic, "message_retention_duration"))
    return out


# -- push config ---------------------------------------------------------------------------
def push_config_request(config: pb.PushConfig, where: str = "push_config") -> dict[str, Any]:
    """A PushConfig as the dict ``types.PushConfig.coerce`` takes (empty endpoint: pull)."""
    refuse_unsupported(config, PUSH_CONFIG_FIELDS, (), where)
    out: dict[str, Any] = {"push_endpoint": config.push_endpoint, "attributes": dict(config.attributes)}
    given = set(set_fields(config))
    if "oidc_token" in given:
        out["oidc_token"] = {
            "service_account_email": config.oidc_token.service_account_email,
            "audience": config.oidc_token.audience,
        }
    if "no_wrapper" in given:
        out["no_wrapper"] = {"write_metadata": bool(config.no_wrapper.write_metadata)}
    return out


def push_config_to_proto(config: PushConfig) -> pb.PushConfig:
    out = pb.PushConfig(push_endpoint=config.push_endpoint, attributes=dict(config.attributes))
    if config.oidc_token is not None:
        out.oidc_token = pb.PushConfig.OidcToken(
            service_account_email=config.oidc_token.service_account_email, audience=config.oidc_token.audience
        )
    if config.no_wrapper is not None:
        out.no_wrapper = pb.PushConfig.NoWrapper(write_metadata=config.no_wrapper.write_metadata)
    return out


# -- subscriptions --------------------------------------------------------------------------
def _retry_policy(policy: pb.RetryPolicy) -> dict[str, Any]:
    given = set(set_fields(policy))
    return {
        name: (_seconds(getattr(policy, name)) if name in given else None) for name in ("minimum_backoff", "maximum_backoff")
    }


def subscription_values(sub: pb.Subscription, paths: Iterable[str] | None = None, where: str = "subscription") -> dict[str, Any]:
    """The deltabus request values of a Subscription: every set field (create), or the fields
    named in `paths` (update; an unset one there clears it, as Pub/Sub's update_mask)."""
    given = set(set_fields(sub))
    if paths is None:
        if "detached" in given:
            raise InvalidArgument(f"{where}.detached", "is set by DetachSubscription only (leave it unset)")
        refuse_unsupported(sub, SUBSCRIPTION_FIELDS, SUBSCRIPTION_OUTPUT_ONLY, where)
        wanted = given & SUBSCRIPTION_FIELDS  # output-only fields are not part of a request
    else:
        wanted = set(paths)
    out: dict[str, Any] = {}
    for name in sorted(wanted):
        if name not in SUBSCRIPTION_FIELDS:
            out[name] = None  # the client names it in its "cannot update" error
        elif name == "push_config":
            out[name] = push_config_request(sub.push_config, f"{where}.push_config") if name in given else {}
        elif name == "retry_policy":
            out[name] = _retry_policy(sub.retry_policy) if name in given else None
        elif name == "dead_letter_policy":
            if name in given:
                d = sub.dead_letter_policy
                out[name] = {"dead_letter_topic": d.dead_letter_topic, "max_delivery_attempts": d.max_delivery_attempts}
            else:
                out[name] = None
        elif name == "expiration_policy":
            # Set with no ttl: never expires (Pub/Sub's empty policy); not set: the default.
            if name in given:
                ttl = "ttl" in set_fields(sub.expiration_policy)
                out[name] = {"ttl": _seconds(getattr(sub.expiration_policy, "ttl")) if ttl else None}  # a timedelta (proto-plus)
            else:
                out[name] = None
        elif name == "bigquery_config":  # deltabus's delta_config; unset (or an empty table): no export
            out["delta_config"] = bigquery_config_request(sub.bigquery_config, f"{where}.bigquery_config") if name in given else None
        elif name == "message_retention_duration":  # unset: the default, 7 days
            out[name] = _seconds(getattr(sub, name)) if name in given else None
        elif name == "labels":
            out[name] = dict(sub.labels)
        elif name == "ack_deadline_seconds":
            if sub.ack_deadline_seconds or paths is not None:
                out[name] = sub.ack_deadline_seconds or 10  # 0 is the default, 10 s
        else:
            out[name] = getattr(sub, name)
    return out


def bigquery_config_request(config: pb.BigQueryConfig, where: str = "bigquery_config") -> dict[str, Any]:
    """A BigQueryConfig as the ``delta_config`` dict ``types.DeltaConfig.coerce`` takes."""
    refuse_unsupported(config, BIGQUERY_CONFIG_FIELDS, BIGQUERY_CONFIG_OUTPUT_ONLY, where)
    return {"table": config.table, "write_metadata": bool(config.write_metadata),
            "drop_unknown_fields": bool(config.drop_unknown_fields)}


def api_field_names(exc: InvalidArgument) -> InvalidArgument:
    """The error with deltabus's ``delta_config`` named as the API's ``bigquery_config``."""
    for ours, api in (("subscription.delta_config", "subscription.bigquery_config"), ("delta_config", "bigquery_config")):
        if exc.field == ours or exc.field.startswith(ours + "."):
            renamed = InvalidArgument(api + exc.field[len(ours):], exc.rule.replace("delta_config", "bigquery_config"))
            return renamed
    if "delta_config" in exc.rule:
        return InvalidArgument(exc.field, exc.rule.replace("delta_config", "bigquery_config"))
    return exc


def update_paths(paths: Iterable[str]) -> list[str]:
    """An update mask's paths as deltabus names them (``bigquery_config`` -> ``delta_config``)."""
    return ["delta_config" if p == "bigquery_config" else p for p in paths]


EXPORT_STATES: dict[str, int] = {  # BigQueryConfig.State values
    "delta permission denied": pb.BigQueryConfig.State.PERMISSION_DENIED,
    "delta not found": pb.BigQueryConfig.State.NOT_FOUND,
    "delta schema mismatch": pb.BigQueryConfig.State.SCHEMA_MISMATCH,
}


def export_state(last_status: str | None) -> int:
    """A Delta export's BigQueryConfig state from the push job's latest outcome for it."""
    return EXPORT_STATES.get(last_status or "", pb.BigQueryConfig.State.ACTIVE)


def subscription_to_proto(sub: Subscription, export_status: str | None = None) -> pb.Subscription:
    """`export_status`: the backlog's last_status of a Delta export (``export_state``)."""
    out = pb.Subscription(
        name=sub.name,
        topic=sub.topic,
        push_config=push_config_to_proto(sub.push_config),
        ack_deadline_seconds=sub.ack_deadline_seconds,
        labels=dict(sub.labels),
        enable_message_ordering=sub.enable_message_ordering,
        filter=sub.filter,
        detached=sub.detached,
        state=pb.Subscription.State.ACTIVE,
        message_retention_duration=dt.timedelta(seconds=sub.message_retention_duration),
        retain_acked_messages=sub.retain_acked_messages,
        enable_exactly_once_delivery=sub.enable_exactly_once_delivery,
    )
    if sub.retry_policy is not None:
        out.retry_policy = pb.RetryPolicy(
            minimum_backoff=dt.timedelta(seconds=sub.retry_policy.minimum_backoff),
            maximum_backoff=dt.timedelta(seconds=sub.retry_policy.maximum_backoff),
        )
    if sub.delta_config is not None:
        out.bigquery_config = pb.BigQueryConfig(
            table=sub.delta_config.table, write_metadata=sub.delta_config.write_metadata,
            drop_unknown_fields=sub.delta_config.drop_unknown_fields, state=export_state(export_status),
        )
    ttl = sub.expiration_policy.ttl
    out.expiration_policy = pb.ExpirationPolicy(ttl=dt.timedelta(seconds=ttl)) if ttl is not None else pb.ExpirationPolicy()
    if sub.dead_letter_policy is not None:
        out.dead_letter_policy = pb.DeadLetterPolicy(
            dead_letter_topic=sub.dead_letter_policy.dead_letter_topic,
            max_delivery_attempts=sub.dead_letter_policy.max_delivery_attempts,
        )
    return out


# -- messages ---------------------------------------------------------------------------------
def message_request(message: Any) -> dict[str, Any]:
    """A PubsubMessage to publish (proto-plus, or the protobuf message under it: Publish reads
    the request's raw messages, ``raw``), as publish_batch's dict (message_id and
    publish_time are the server's to set: ignored, as Pub/Sub does)."""
    m = raw(message)
    return {"data": bytes(m.data), "attributes": dict(m.attributes), "ordering_key": m.ordering_key}


def raw(message: Any) -> Any:
    """The protobuf message under a proto-plus one (itself when it is one already). Reading
    fields from it skips proto-plus's per-access marshalling: measured with py-spy on
    bench/server.py's publish phase, Publish's per-message field reads through proto-plus
    were ~40% of the event loop's time."""
    pb_of = getattr(type(message), "pb", None)  # proto-plus classes have it, protobuf ones do not
    return pb_of(message) if pb_of is not None else message


def received_to_proto(
    ack_id: str,
    data: bytes,
    attributes: Mapping[str, str],
    message_id: str,
    publish_time: dt.datetime | None,
    ordering_key: str,
    delivery_attempt: int,
) -> pb.ReceivedMessage:
    out: pb.ReceivedMessage = pb.ReceivedMessage.wrap(
        received_raw(ack_id, data, attributes, message_id, publish_time, ordering_key, delivery_attempt))
    return out


_RAW_MESSAGE = pb.PubsubMessage.pb()
_RAW_RECEIVED = pb.ReceivedMessage.pb()


def received_raw(
    ack_id: str,
    data: bytes,
    attributes: Mapping[str, str],
    message_id: str,
    publish_time: dt.datetime | None,
    ordering_key: str,
    delivery_attempt: int,
) -> Any:
    """``received_to_proto`` as the protobuf message itself (StreamingPull builds its
    responses from these and wraps each response once: proto-plus's constructors marshal
    every field of every message, measured ~5% of the server's GIL time at 500 msg/s)."""
    message = _RAW_MESSAGE(data=data, attributes=attributes, message_id=message_id, ordering_key=ordering_key)
    if publish_time is not None:  # a naive datetime is UTC
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(publish_time if publish_time.tzinfo else publish_time.replace(tzinfo=dt.timezone.utc))
        message.publish_time.CopyFrom(stamp)
    return _RAW_RECEIVED(ack_id=ack_id, message=message, delivery_attempt=delivery_attempt)


# -- seek and snapshots (issue 15) -------------------------------------------------------------
def seek_request(request: pb.SeekRequest) -> dict[str, Any]:
    """The SubscriberClient.seek request dict of a SeekRequest: ``subscription`` and the one
    target set, ``time`` as ``{"seconds", "nanos"}`` (the Timestamp exactly, where a datetime
    would round to the microsecond) or ``snapshot`` (a name; an empty one set is refused
    naming ``snapshot``). InvalidArgument naming ``target`` when neither is set."""
    raw = type(request).pb(request)
    which = raw.WhichOneof("target")
    out: dict[str, Any] = {"subscription": request.subscription}
    if which == "time":
        out["time"] = {"seconds": int(raw.time.seconds), "nanos": int(raw.time.nanos)}
    elif which == "snapshot":
        if not raw.snapshot:
            raise InvalidArgument("snapshot", "must name a snapshot 'projects/PROJECT/snapshots/ID', got ''")
        out["snapshot"] = raw.snapshot
    else:
        raise InvalidArgument("target", "set one of time and snapshot (the seek's target); neither is set")
    return out


def create_snapshot_request(request: pb.CreateSnapshotRequest) -> dict[str, Any]:
    """The SubscriberClient.create_snapshot request dict (name, subscription, labels);
    any other field set (``tags``) is refused with InvalidArgument naming it."""
    for name in set_fields(request):
        if name not in CREATE_SNAPSHOT_FIELDS:
            raise InvalidArgument(name, "is not supported by deltabus serve (leave it unset)")
    return {"name": request.name, "subscription": request.subscription, "labels": dict(request.labels)}


def snapshot_update(request: pb.UpdateSnapshotRequest) -> dict[str, Any]:
    """The SubscriberClient.update_snapshot request dict: ``labels`` is the only path the
    update mask may name (at least once); anything else is refused naming ``update_mask``
    (``expire_time`` with why). A masked ``labels`` left empty clears them."""
    paths = mask_paths(request.update_mask if "update_mask" in request else None)
    if "expire_time" in paths:
        raise InvalidArgument(
            "update_mask", "cannot update expire_time: a snapshot expires 7 days after its oldest unacked message"
            f" was published; updatable fields: {list(UPDATABLE_SNAPSHOT_FIELDS)}"
        )
    bad = [p for p in paths if p not in UPDATABLE_SNAPSHOT_FIELDS]
    if bad:
        raise InvalidArgument("update_mask", f"cannot update {bad}; updatable fields: {list(UPDATABLE_SNAPSHOT_FIELDS)}")
    snapshot = {"name": request.snapshot.name, "labels": dict(request.snapshot.labels)}
    return {"snapshot": snapshot, "update_mask": list(UPDATABLE_SNAPSHOT_FIELDS)}


def snapshot_to_proto(snapshot: Snapshot) -> pb.Snapshot:
    """A deltabus Snapshot as the API's (expire_time in UTC; left unset when unknown)."""
    fields: dict[str, Any] = {"name": snapshot.name, "topic": snapshot.topic, "labels": dict(snapshot.labels)}
    expire = snapshot.expire_time
    if expire is not None:  # proto-plus turns a datetime into a Timestamp
        fields["expire_time"] = expire if expire.tzinfo else expire.replace(tzinfo=dt.timezone.utc)
    return pb.Snapshot(**fields)


def mask_paths(mask: Any, field: str = "update_mask") -> list[str]:
    """The paths of a FieldMask; at least one is required."""
    paths = list(mask.paths) if mask is not None else []
    if not paths:
        raise InvalidArgument(field, "name at least one field to update")
    return paths
