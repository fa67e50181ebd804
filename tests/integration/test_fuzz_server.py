"""Property-based fuzzing of `deltabus serve` at the gRPC level (issue 16).

Requests are ``google.pubsub_v1.types`` messages (and raw bytes) sent over a plain grpc
channel, so nothing is retried or checked on the client side. A bad request ends with
INVALID_ARGUMENT whose message names the field (``FIELD: RULE``), or NOT_FOUND /
ALREADY_EXISTS / FAILED_PRECONDITION where that is the answer; never INTERNAL or UNKNOWN;
and the warehouse is byte-identical afterwards. Good requests round-trip: Create then Get
gives the same resource, and a published message comes back through Pull.

One server (in this process, on a free port) and warehouse for the module, settled
before the first hash; derandomized small example counts.
"""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as pb
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from deltabus.server.app import PUBLISHER_METHODS, SUBSCRIBER_METHODS, ServerThread
from deltabus.server.settings import ServeSettings
from tests.integration.test_fuzz_api import tree_digest

P = "projects/srv"
FUZZ = settings(
    max_examples=25, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
METHODS = {m.name: ("Publisher", m) for m in PUBLISHER_METHODS} | {m.name: ("Subscriber", m) for m in SUBSCRIBER_METHODS}
REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
            grpc.StatusCode.FAILED_PRECONDITION)


def _encode(message: Any) -> bytes:
    if isinstance(message, bytes):
        return message
    return bytes(type(message).serialize(message))


class World:
    def __init__(self, root: Path) -> None:
        self.warehouse = str(root / "warehouse")
        self.server = ServerThread(ServeSettings(warehouse=self.warehouse, port=0, grace_seconds=1.0)).start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.counter = itertools.count()
        self.topic, self.dlq, self.sub = f"{P}/topics/base", f"{P}/topics/dlq", f"{P}/subscriptions/base-sub"
        self.call("CreateTopic", pb.Topic(name=self.topic))
        self.call("CreateTopic", pb.Topic(name=self.dlq))
        self.call("CreateSubscription", pb.Subscription(name=self.sub, topic=self.topic))
        self.call("Publish", pb.PublishRequest(topic=self.topic, messages=[pb.PubsubMessage(data=b"settle")]))
        self.pull_all(1)

    def call(self, method: str, request: Any) -> Any:
        service, m = METHODS[method]
        response = m.response.FromString if m.response is empty_pb2.Empty else m.response.deserialize
        fn = self.channel.unary_unary(f"/google.pubsub.v1.{service}/{method}", request_serializer=_encode,
                                      response_deserializer=response)
        return fn(request, timeout=30)

    def pull_all(self, n: int) -> dict[str, pb.PubsubMessage]:
        got: dict[str, pb.PubsubMessage] = {}
        for _ in range(5):
            rs = self.call("Pull", pb.PullRequest(subscription=self.sub, max_messages=1000, return_immediately=True)).received_messages
            if rs:
                self.call("Acknowledge", pb.AcknowledgeRequest(subscription=self.sub, ack_ids=[r.ack_id for r in rs]))
            got.update({r.message.message_id: r.message for r in rs})
            if len(got) >= n:
                break
        return got

    def fresh(self, kind: str) -> str:
        return f"{P}/{kind}/fresh-{next(self.counter)}"

    def close(self) -> None:
        self.channel.close()
        self.server.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("fuzz-server"))
    yield w
    w.close()


def outcome(world: World, method: str, request: Any, fields: tuple[str, ...]) -> tuple[str, Any]:
    """("ok", response) or ("refused", RpcError). A refusal has a status of REFUSALS, an
    INVALID_ARGUMENT names one of `fields` (or a sub-field), and nothing is written."""
    before = tree_digest(world.warehouse)
    try:
        response = world.call(method, request)
        event("ok")
        return "ok", response
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        event(f"refused: {code.name}")
        assert code in REFUSALS, (method, code, details)
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            field = details.split(": ", 1)[0]
            named = any(field == f or field.startswith((f + ".", f + "[")) for f in fields)
            assert named or ("#" in fields and "#" in field), (method, details, fields)  # "#N": a field number it does not know
        assert tree_digest(world.warehouse) == before, (method, "a refused request wrote to the warehouse")
        return "refused", exc


# -- strategies -----------------------------------------------------------------------------------
int32 = st.integers(-(2**31), 2**31 - 1)
ids = st.from_regex(r"[a-z][a-z0-9\-_.~+%]{2,12}", fullmatch=True).filter(lambda s: not s.startswith("goog"))
names_of = lambda kind: st.one_of(  # noqa: E731
    st.just("fresh"), st.sampled_from([f"{P}/{kind}/ab", f"{P}/{kind}/goog-x", f"{P}/{kind}/abc\n", f"{P}/other/abc", "", "x"]),
    st.text(max_size=20), ids.map(lambda i: f"{P}/{kind}/{i}"),
)
good_labels = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_\-]{0,6}", fullmatch=True), st.from_regex(r"[a-z0-9_\-]{0,6}", fullmatch=True),
                              max_size=3)
label_maps = st.one_of(good_labels, st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2))
durations = st.one_of(st.timedeltas(min_value=dt.timedelta(days=-400), max_value=dt.timedelta(days=400)),
                      st.sampled_from([dt.timedelta(0), dt.timedelta(seconds=600), dt.timedelta(days=7), dt.timedelta(microseconds=1)]))
endpoints = st.sampled_from(["https://example.com/push", "http://127.0.0.1:8/x", "https://example.com:0/", "https://u:p@example.com/",
                             "ftp://x.com/", "https://a b/", "", "https://example.com/#f", "https://%zz/"])


@st.composite
def push_configs(draw: Any) -> pb.PushConfig:
    c = pb.PushConfig(push_endpoint=draw(endpoints), attributes=draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2)))
    if draw(st.booleans()):
        c.oidc_token = pb.PushConfig.OidcToken(service_account_email=draw(st.sampled_from(["sa@p.iam", "nope", ""])),
                                               audience=draw(st.text(max_size=5)))
    if draw(st.booleans()):
        c.no_wrapper = pb.PushConfig.NoWrapper(write_metadata=draw(st.booleans()))
    if draw(st.integers(0, 5)) == 0:
        c.pubsub_wrapper = pb.PushConfig.PubsubWrapper()
    return c


@st.composite
def good_subscriptions(draw: Any, name: str, topic: str) -> pb.Subscription:
    """Settings every one of which is valid (so that good requests are drawn often enough)."""
    s = pb.Subscription(name=name, topic=topic, ack_deadline_seconds=draw(st.sampled_from([0, 10, 45, 600])),
                        labels=draw(good_labels),
                        filter=draw(st.sampled_from(["", 'attributes.k = "v"', "NOT attributes:k"])))
    if draw(st.booleans()):
        s.push_config = pb.PushConfig(push_endpoint="https://example.com/push", oidc_token=pb.PushConfig.OidcToken(service_account_email="sa@p.iam"))
    if draw(st.booleans()):
        s.retry_policy = pb.RetryPolicy(minimum_backoff=dt.timedelta(seconds=draw(st.integers(0, 300))), maximum_backoff=dt.timedelta(seconds=600))
    if draw(st.booleans()):
        s.dead_letter_policy = pb.DeadLetterPolicy(dead_letter_topic=f"{P}/topics/dlq", max_delivery_attempts=draw(st.integers(5, 100)))
    if draw(st.booleans()):
        s.expiration_policy = pb.ExpirationPolicy(ttl=dt.timedelta(days=draw(st.integers(1, 365))))
    s.enable_message_ordering = draw(st.booleans())
    return s


@st.composite
def subscriptions(draw: Any, name: str, topic: str) -> pb.Subscription:
    if draw(st.integers(0, 2)) == 0:
        return draw(good_subscriptions(name, topic))
    s = pb.Subscription(name=name, topic=topic)
    if draw(st.booleans()):
        s.ack_deadline_seconds = draw(st.one_of(st.integers(0, 700), int32))
    if draw(st.booleans()):
        s.labels = draw(label_maps)
    if draw(st.booleans()):
        s.push_config = draw(push_configs())
    if draw(st.booleans()):
        s.retry_policy = pb.RetryPolicy(**draw(st.fixed_dictionaries({}, optional={"minimum_backoff": durations, "maximum_backoff": durations})))
    if draw(st.booleans()):
        s.dead_letter_policy = pb.DeadLetterPolicy(dead_letter_topic=draw(st.sampled_from([f"{P}/topics/dlq", f"{P}/topics/missing", "x", ""])),
                                                   max_delivery_attempts=draw(st.one_of(st.integers(-1, 120), int32)))
    if draw(st.booleans()):
        s.filter = draw(st.one_of(st.sampled_from(['attributes.k = "v"', "attributes:k AND", "x" * 257]), st.text(max_size=8)))
    if draw(st.booleans()):
        s.expiration_policy = pb.ExpirationPolicy(**draw(st.fixed_dictionaries({}, optional={"ttl": durations})))
    if draw(st.booleans()):
        s.message_retention_duration = draw(durations)
    for flag in ("enable_message_ordering", "retain_acked_messages", "enable_exactly_once_delivery"):
        if draw(st.booleans()):
            setattr(s, flag, True)
    extra = draw(st.sampled_from(["", "", "", "", "detached", "bigquery", "state"]))
    if extra == "detached":
        s.detached = True
    elif extra == "bigquery":
        s.bigquery_config = pb.BigQueryConfig(table="p.d.t")
    elif extra == "state":
        s.state = pb.Subscription.State.RESOURCE_ERROR  # output only: ignored
    return s


SUB_FIELDS = ("name", "topic", "push_config", "ack_deadline_seconds", "labels", "enable_message_ordering", "retry_policy",
              "dead_letter_policy", "filter", "expiration_policy", "message_retention_duration", "retain_acked_messages",
              "enable_exactly_once_delivery", "subscription", "request")


# -- topics -------------------------------------------------------------------------------------------
@FUZZ
@given(names_of("topics"), label_maps, st.one_of(st.none(), durations), st.sampled_from(["", "", "kms", "schema"]))
@example("fresh", {"team\n": "x"}, None, "")
@example("fresh", {}, dt.timedelta(seconds=599), "")
def test_create_topic(world: World, name: str, labels: dict[str, str], retention: Any, extra: str) -> None:
    name = world.fresh("topics") if name == "fresh" else name
    topic = pb.Topic(name=name, labels=labels)
    if retention is not None:
        topic.message_retention_duration = retention
    if extra == "kms":
        topic.kms_key_name = "k"
    elif extra == "schema":
        topic.schema_settings = pb.SchemaSettings(schema="projects/p/schemas/s")
    kind, got = outcome(world, "CreateTopic", topic, ("name", "labels", "message_retention_duration", "topic"))
    if kind == "ok":
        assert got.name == name and dict(got.labels) == labels
        assert world.call("GetTopic", pb.GetTopicRequest(topic=name)) == got


@FUZZ
@given(label_maps, st.one_of(st.none(), durations), st.lists(st.sampled_from(["labels", "message_retention_duration", "name", "kms_key_name", "x"]),
                                                           max_size=3))
def test_update_topic(world: World, labels: dict[str, str], retention: Any, paths: list[str]) -> None:
    topic = pb.Topic(name=world.dlq, labels=labels)
    if retention is not None:
        topic.message_retention_duration = retention
    request = pb.UpdateTopicRequest(topic=topic, update_mask={"paths": paths})
    kind, got = outcome(world, "UpdateTopic", request, ("update_mask", "topic", "labels", "message_retention_duration"))
    if kind == "ok":
        assert world.call("GetTopic", pb.GetTopicRequest(topic=world.dlq)) == got


# -- subscriptions ------------------------------------------------------------------------------------
@FUZZ
@given(st.data(), names_of("subscriptions"), st.sampled_from(["base", "missing", "bad"]))
def test_create_subscription(world: World, data: Any, name: str, which: str) -> None:
    name = world.fresh("subscriptions") if name == "fresh" else name
    topic = {"base": world.topic, "missing": f"{P}/topics/missing", "bad": "topics/x"}[which]
    request = data.draw(subscriptions(name, topic))
    kind, got = outcome(world, "CreateSubscription", request, SUB_FIELDS)
    if kind == "ok":
        assert world.call("GetSubscription", pb.GetSubscriptionRequest(subscription=name)) == got
        assert got.name == name and got.topic == topic and dict(got.labels) == dict(request.labels)
        assert got.ack_deadline_seconds == (request.ack_deadline_seconds or 10) and got.filter == request.filter
        assert got.push_config.push_endpoint == request.push_config.push_endpoint


UPDATE_PATHS = ["ack_deadline_seconds", "labels", "push_config", "retry_policy", "dead_letter_policy", "expiration_policy",
                "message_retention_duration", "retain_acked_messages", "enable_exactly_once_delivery", "filter", "name", "detached", "x"]


@FUZZ
@given(st.data(), st.lists(st.sampled_from(UPDATE_PATHS), max_size=3, unique=True), st.sampled_from(["upd", "missing", "bad"]))
def test_update_subscription(world: World, data: Any, paths: list[str], which: str) -> None:
    name = {"upd": f"{P}/subscriptions/upd-sub", "missing": f"{P}/subscriptions/missing", "bad": "x"}[which]
    if which == "upd":
        try:
            world.call("CreateSubscription", pb.Subscription(name=name, topic=world.dlq))
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.ALREADY_EXISTS
    sub = data.draw(subscriptions(name, ""))
    request = pb.UpdateSubscriptionRequest(subscription=sub, update_mask={"paths": paths})
    kind, got = outcome(world, "UpdateSubscription", request, ("update_mask", "subscription") + SUB_FIELDS)
    if kind == "ok":
        assert world.call("GetSubscription", pb.GetSubscriptionRequest(subscription=name)) == got
        if "labels" in paths:
            assert dict(got.labels) == dict(sub.labels)


@FUZZ
@given(st.sampled_from(["upd", "missing", "bad"]), st.one_of(st.none(), push_configs()))
def test_modify_push_config(world: World, which: str, push: Any) -> None:
    name = {"upd": f"{P}/subscriptions/upd-sub", "missing": f"{P}/subscriptions/missing", "bad": "x"}[which]
    request = pb.ModifyPushConfigRequest(subscription=name)
    if push is not None:
        request.push_config = push
    outcome(world, "ModifyPushConfig", request, ("subscription", "push_config"))


# -- publish, pull, acks ------------------------------------------------------------------------------
good_messages = st.builds(
    lambda d, a, k: pb.PubsubMessage(data=d, attributes=a, ordering_key=k),
    st.binary(min_size=1, max_size=20),
    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True).filter(lambda s: not s.startswith("goog")), st.text(max_size=6), max_size=3),
    st.text(max_size=5),
)
any_messages = st.builds(
    lambda d, a, k, mid: pb.PubsubMessage(data=d, attributes=a, ordering_key=k, message_id=mid),
    st.binary(max_size=20),  # an oversize message is an @example: drawn twice, it is over grpc's own request limit
    st.dictionaries(st.one_of(st.text(max_size=6), st.sampled_from(["goog", "", "k" * 257])), st.one_of(st.text(max_size=6), st.just("v" * 1025)),
                    max_size=3),
    st.one_of(st.text(max_size=5), st.just("k" * 1025)),
    st.text(max_size=4),
)


@settings(FUZZ, max_examples=25)
@given(st.lists(st.one_of(good_messages, good_messages, any_messages), max_size=3), st.sampled_from(["base", "base", "missing", "bad"]))
@example([pb.PubsubMessage(data=b"")], "base")
@example([pb.PubsubMessage(data=b"ok"), pb.PubsubMessage(data=b"x" * 10_000_001)], "base")
@example([pb.PubsubMessage(data=b"ok"), pb.PubsubMessage(data=b"x", attributes={"goog-a": "1"})], "base")
def test_publish(world: World, messages: list[pb.PubsubMessage], which: str) -> None:
    topic = {"base": world.topic, "missing": f"{P}/topics/missing", "bad": "x"}[which]
    kind, got = outcome(world, "Publish", pb.PublishRequest(topic=topic, messages=messages), ("topic", "messages"))
    if kind == "ok":
        pulled = world.pull_all(len(got.message_ids))
        assert sorted(pulled) == sorted(got.message_ids)
        for mid, m in zip(got.message_ids, messages):
            back = pulled[mid]
            assert (back.data, dict(back.attributes), back.ordering_key) == (m.data, dict(m.attributes), m.ordering_key)


uid_ack_ids = st.builds(lambda b, c: f"UID.{b}.{c}", st.integers(0, 10**12), st.integers(1, 3))  # well formed, naming no delivery
ack_id_lists = st.one_of(st.lists(uid_ack_ids, min_size=1, max_size=2),
                         st.lists(st.one_of(st.text("abs_-0123456789.\n", max_size=24), st.text(max_size=10), uid_ack_ids), max_size=3))


@FUZZ
@given(ack_id_lists, st.one_of(st.just(None), int32, st.integers(-5, 700)), st.sampled_from(["base", "base", "missing", "bad"]))
@example(["abc.1.1\n"], None, "base")
@example(["abc.1.1"], 601, "base")
@example(["abc.1.1"], -1, "base")
@example(["UID.0.1"], None, "base")  # well-formed, naming no delivery: not even a history row is written (found by CI)
@example(["UID.0.1"], 0, "base")
@example([], None, "base")
def test_acknowledge_and_modify_ack_deadline(world: World, ack_ids: list[str], seconds: int | None, which: str) -> None:
    name = {"base": world.sub, "missing": f"{P}/subscriptions/missing", "bad": "x"}[which]
    uid = world.server.state.subscriber._sub(world.sub).sub_uid
    ack_ids = [a.replace("UID", uid, 1) for a in ack_ids]
    before = tree_digest(world.warehouse)
    if seconds is None:
        outcome(world, "Acknowledge", pb.AcknowledgeRequest(subscription=name, ack_ids=ack_ids), ("subscription", "ack_ids"))
    else:
        outcome(world, "ModifyAckDeadline", pb.ModifyAckDeadlineRequest(subscription=name, ack_ids=ack_ids, ack_deadline_seconds=seconds),
                ("subscription", "ack_ids", "ack_deadline_seconds"))
    assert tree_digest(world.warehouse) == before  # ids that name no delivery are ignored, and write nothing


@FUZZ
@given(st.one_of(int32, st.integers(-3, 3)), st.sampled_from(["base", "missing", "bad", ""]))
def test_pull(world: World, n: int, which: str) -> None:
    name = {"base": world.sub, "missing": f"{P}/subscriptions/missing", "bad": "x", "": ""}[which]
    kind, got = outcome(world, "Pull", pb.PullRequest(subscription=name, max_messages=n, return_immediately=True),
                        ("subscription", "max_messages"))
    if kind == "ok":
        assert list(got.received_messages) == []  # the backlog is empty


# -- seek and snapshots -------------------------------------------------------------------------------
@FUZZ
@given(st.one_of(st.none(), st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 999_999_999)),
                 st.tuples(st.integers(-62_135_596_800, 253_402_300_799), st.integers(0, 999_999_999)),
                 st.sampled_from(["", "missing", "bad"])),
       st.sampled_from(["base", "missing", "bad"]))
@example((253_402_300_800 * 10, 0), "base")  # far past 9999: seek raised OverflowError (INTERNAL) before the fix
@example((-62_135_596_801, 0), "base")
@example(None, "base")
@example("", "base")
def test_seek(world: World, target: Any, which: str) -> None:
    name = {"base": world.sub, "missing": f"{P}/subscriptions/missing", "bad": "x"}[which]
    request = pb.SeekRequest(subscription=name)
    raw = pb.SeekRequest.pb(request)
    if isinstance(target, tuple):
        raw.time.seconds, raw.time.nanos = target
    elif isinstance(target, str):
        raw.snapshot = {"missing": f"{P}/snapshots/missing", "bad": "bad"}.get(target, target)
    outcome(world, "Seek", pb.SeekRequest.wrap(raw), ("subscription", "time", "snapshot", "target"))


@FUZZ
@given(names_of("snapshots"), st.sampled_from(["base", "missing", "bad"]), label_maps, st.booleans())
def test_create_snapshot(world: World, name: str, which: str, labels: dict[str, str], tags: bool) -> None:
    name = world.fresh("snapshots") if name == "fresh" else name
    sub = {"base": world.sub, "missing": f"{P}/subscriptions/missing", "bad": "x"}[which]
    request = pb.CreateSnapshotRequest(name=name, subscription=sub, labels=labels)
    if tags:
        request.tags = {"tagKeys/1": "tagValues/1"}
    kind, got = outcome(world, "CreateSnapshot", request, ("name", "subscription", "labels", "tags"))
    if kind == "ok":
        assert world.call("GetSnapshot", pb.GetSnapshotRequest(snapshot=name)) == got
        world.call("DeleteSnapshot", pb.DeleteSnapshotRequest(snapshot=name))


@FUZZ
@given(st.sampled_from(["ListTopics", "ListSubscriptions", "ListSnapshots", "ListTopicSubscriptions", "ListTopicSnapshots"]),
       st.one_of(st.just(""), st.text(max_size=16)), int32, st.sampled_from(["good", "bad", ""]))
def test_listings(world: World, method: str, token: str, size: int, scope: str) -> None:
    _, m = METHODS[method]
    key = "topic" if "Topic" in method and method != "ListTopics" else "project"
    value = {"good": world.topic if key == "topic" else P, "bad": "x y", "": ""}[scope]
    request = m.request(**{key: value, "page_size": size, "page_token": token})
    outcome(world, method, request, (key, "page_size", "page_token"))


# -- whatever bytes arrive ------------------------------------------------------------------------------
UNARY = sorted(METHODS)


@settings(FUZZ, max_examples=30)
@given(st.sampled_from(UNARY), st.one_of(st.binary(max_size=40), st.builds(lambda n, b: bytes([n << 3 | 2, len(b)]) + b,
                                                                              st.integers(1, 15), st.binary(max_size=20))))
@example("CreateTopic", b"\xff\xff\xff")  # not protobuf: grpc answered UNKNOWN (a code Publish clients retry)
@example("GetTopic", b"\x0a\x02\xc3\x28")  # a string field that is not UTF-8
@example("Publish", b"\xa2\x06\x01x")  # field number 100: refused by number
def test_any_request_bytes(world: World, method: str, body: bytes) -> None:
    if method in ("DeleteTopic", "DeleteSubscription", "DetachSubscription", "DeleteSnapshot"):
        body = body.replace(b"base", b"bsae")  # a good delete would remove the module's names
    outcome(world, method, body, ("request", "#", "name", "topic", "subscription", "snapshot", "project", "labels", "ack_ids",
                                  "ack_deadline_seconds", "max_messages", "messages", "page_token", "page_size", "update_mask",
                                  "push_config", "target", "time"))
