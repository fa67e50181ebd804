"""Property-based fuzzing of the public Python API on a real Delta warehouse (issue 16).

Every bad input gets ``InvalidArgument`` naming its field (``NotFound`` / ``AlreadyExists``
where that is the answer) and leaves the warehouse byte-identical: every file's relative
path and bytes are hashed before and after the call. Good inputs round-trip: create then
get gives the same fields, and a published message comes back through pull with the same
data, attributes and ordering key.

One warehouse for the module (opened, with a topic, a subscription and one pull+ack done,
before the first hash, so lazily created state is settled), derandomized small example counts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from deltabus import PublisherClient, SubscriberClient, types
from deltabus.errors import AlreadyExists, InvalidArgument, NotFound

PROJECT = "fz"
FUZZ = settings(
    max_examples=25, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def tree_digest(root: str) -> str:
    """A hash of every file (relative path and bytes) and directory under root."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        h.update(f"D {rel}\0".encode())
        for f in sorted(filenames):
            h.update(f"F {os.path.join(rel, f)}\0".encode())
            h.update(Path(dirpath, f).read_bytes())
            h.update(b"\0")
    return h.hexdigest()


class World:
    """The module's warehouse and clients, with names that exist."""

    def __init__(self, root: Path) -> None:
        self.warehouse = str(root / "warehouse")
        self.pub = PublisherClient(warehouse=self.warehouse)
        self.opub = PublisherClient(warehouse=self.warehouse, publisher_options=types.PublisherOptions(enable_message_ordering=True))
        self.sub = SubscriberClient(warehouse=self.warehouse, allow_http=False)
        self.topic = f"projects/{PROJECT}/topics/base"
        self.dlq = f"projects/{PROJECT}/topics/dlq"
        self.subscription = f"projects/{PROJECT}/subscriptions/base-sub"
        self.updated = f"projects/{PROJECT}/subscriptions/updated-sub"
        self.pub.create_topic(name=self.topic)
        self.pub.create_topic(name=self.dlq)
        self.sub.create_subscription(name=self.subscription, topic=self.topic)
        self.sub.create_subscription(name=self.updated, topic=self.dlq)
        # Settle what the first uses write (fan-out cursor, activity records, lazily made tables).
        self.pub.publish_batch(self.topic, [{"data": b"settle"}])
        for name in (self.subscription, self.updated):
            got = self.sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages
            if got:
                self.sub.acknowledge(subscription=name, ack_ids=[r.ack_id for r in got])
        self.counter = itertools.count()

    def with_uid(self, ids: Any) -> Any:
        """Ack ids with "UID" made the subscription's own uid."""
        if not isinstance(ids, list):
            return ids
        uid = self.sub.get_subscription(subscription=self.subscription) and self.sub._sub(self.subscription).sub_uid
        return [i.replace("UID", uid, 1) if isinstance(i, str) else i for i in ids]

    def fresh(self, kind: str) -> str:
        return f"projects/{PROJECT}/{kind}/fresh-{next(self.counter)}"

    def close(self) -> None:
        self.pub.stop()
        self.opub.stop()
        self.sub.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("fuzz-api"))
    yield w
    w.close()


def outcome(world: World, call: Callable[[], Any], fields: tuple[str, ...]) -> tuple[str, Any]:
    """("ok", value) or ("refused", exc). A refusal must be InvalidArgument naming one of
    `fields` (or a sub-field), NotFound or AlreadyExists, and write nothing."""
    before = tree_digest(world.warehouse)
    try:
        value = call()
        event("ok")
        return "ok", value
    except InvalidArgument as exc:
        assert any(exc.field == f or exc.field.startswith((f + ".", f + "[")) for f in fields), (exc.field, fields, exc.rule)
        assert exc.rule and "\n" not in str(exc)
        result: tuple[str, Any] = ("refused", exc)
    except (NotFound, AlreadyExists) as exc:
        result = ("refused", exc)
    assert tree_digest(world.warehouse) == before, "a refused call wrote to the warehouse"
    event(f"refused: {type(result[1]).__name__}")
    return result


# -- strategies --------------------------------------------------------------------------------
keys = st.one_of(st.text(max_size=6), st.integers(-2, 2))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=12), st.binary(max_size=8))
junk = st.recursive(scalars, lambda i: st.one_of(st.lists(i, max_size=2), st.dictionaries(keys, i, max_size=2)), max_leaves=5)
ids = st.from_regex(r"[a-z][a-z0-9\-_.~+%]{2,20}", fullmatch=True).filter(lambda s: not s.startswith("goog"))
bad_ids = st.one_of(st.text("aZ9-_.~+%/ \né", max_size=8), st.sampled_from(["ab", "goog-x", "1abc", "abc\n", ""]))
label_text = st.text("abz09_-A .\n", max_size=8)
labels = st.one_of(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_\-]{0,8}", fullmatch=True), st.from_regex(r"[a-z0-9_\-]{0,8}", fullmatch=True), max_size=3),
                   st.dictionaries(label_text, label_text, max_size=2), junk)
durations = st.one_of(st.integers(-10, 3_000_000), st.floats(), st.text("0123456789.s-", max_size=6), junk)
endpoints = st.one_of(
    st.sampled_from(["https://example.com/push", "https://127.0.0.1:8443/p?token=x", "http://127.0.0.1:8/x", "https://example.com:0/",
                     "https://user:pw@example.com/", "https://example.com/#f", "ftp://example.com/", "https://a b/", "https:///x", ""]),
    st.builds(lambda h, p: f"https://{h}{p}", st.text("ab.-09:[]%", max_size=10), st.text("/?#x ", max_size=4)),
)
push_configs = st.one_of(
    st.none(), junk,
    st.fixed_dictionaries({"push_endpoint": endpoints}, optional={
        "attributes": st.one_of(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), junk),
        "oidc_token": st.one_of(st.fixed_dictionaries({"service_account_email": st.sampled_from(["sa@p.iam", "nope", "", "a@b\n"])},
                                                      optional={"audience": st.one_of(st.text(max_size=6), junk)}), junk),
        "no_wrapper": st.one_of(st.fixed_dictionaries({"write_metadata": st.one_of(st.booleans(), junk)}), junk),
    }),
)


def is_valid_id(text: str) -> bool:
    import re

    return bool(re.fullmatch(r"(?!goog)[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}", text))


# -- topics ------------------------------------------------------------------------------------
@FUZZ
@given(st.one_of(ids, bad_ids), st.one_of(st.none(), labels), st.one_of(st.none(), durations))
@example("abc\n", None, None)
@example("fine-topic", {"team\n": "x"}, None)
@example("fine-topic", None, 10**400)
def test_create_topic(world: World, topic_id: str, lbls: Any, retention: Any) -> None:
    name = f"projects/{PROJECT}/topics/{topic_id}"
    request: dict[str, Any] = {"name": name}
    if lbls is not None:
        request["labels"] = lbls
    if retention is not None:
        request["message_retention_duration"] = retention
    kind, got = outcome(world, lambda: world.pub.create_topic(request=request), ("name", "labels", "message_retention_duration"))
    if kind == "ok":
        assert is_valid_id(topic_id)
        assert got.name == name and dict(got.labels) == dict(lbls or {})
        assert world.pub.get_topic(topic=name) == got
    elif isinstance(got, AlreadyExists):
        assert world.pub.get_topic(topic=name).name == name
    else:
        assert not isinstance(got, NotFound)


@FUZZ
@given(st.one_of(labels, st.none()), st.one_of(durations, st.none()), st.lists(st.sampled_from(["labels", "message_retention_duration", "name", "x"]), max_size=3))
def test_update_topic(world: World, lbls: Any, retention: Any, mask: list[str]) -> None:
    body = {"name": world.dlq, "labels": lbls, "message_retention_duration": retention}
    kind, got = outcome(world, lambda: world.pub.update_topic(topic=body, update_mask=mask),
                        ("topic", "update_mask", "labels", "message_retention_duration"))
    if kind == "ok":
        assert world.pub.get_topic(topic=world.dlq) == got
        if "labels" in mask:
            assert dict(got.labels) == dict(lbls or {})


# -- subscriptions -----------------------------------------------------------------------------
good_creates = st.fixed_dictionaries(
    {"name": st.just("fresh"), "topic": st.just("base")},
    optional={
        "push_config": st.one_of(st.just({}), st.fixed_dictionaries({"push_endpoint": st.just("https://example.com/push")}, optional={
            "oidc_token": st.fixed_dictionaries({"service_account_email": st.just("sa@p.iam"), "audience": st.text("abc:/", max_size=6)}),
            "no_wrapper": st.fixed_dictionaries({"write_metadata": st.booleans()})})),
        "ack_deadline_seconds": st.one_of(st.just(0), st.integers(10, 600)),
        "labels": st.dictionaries(st.from_regex(r"[a-z][a-z0-9_\-]{0,8}", fullmatch=True), st.from_regex(r"[a-z0-9_\-]{0,8}", fullmatch=True), max_size=3),
        "enable_message_ordering": st.booleans(),
        "retry_policy": st.fixed_dictionaries({"minimum_backoff": st.integers(0, 300), "maximum_backoff": st.integers(300, 600)}),
        "dead_letter_policy": st.fixed_dictionaries({"dead_letter_topic": st.just("dlq"), "max_delivery_attempts": st.integers(5, 100)}),
        "filter": st.sampled_from(['attributes.k = "v"', 'hasPrefix(attributes.k, "a")', "NOT attributes:k", ""]),
        "expiration_policy": st.fixed_dictionaries({"ttl": st.sampled_from([None, 86_400, 365 * 86_400])}),
        "message_retention_duration": st.integers(600, 7 * 86_400),
        "retain_acked_messages": st.booleans(),
    },
)
create_requests = st.fixed_dictionaries(
    {"name": st.one_of(st.just("fresh"), bad_ids.map(lambda i: f"projects/{PROJECT}/subscriptions/{i}"), junk),
     "topic": st.one_of(st.just("base"), st.just("missing"), bad_ids.map(lambda i: f"projects/{PROJECT}/topics/{i}"), junk)},
    optional={
        "push_config": push_configs,
        "ack_deadline_seconds": st.one_of(st.integers(-5, 700), junk),
        "labels": labels,
        "enable_message_ordering": st.one_of(st.booleans(), junk),
        "retry_policy": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"minimum_backoff": durations, "maximum_backoff": durations}), junk),
        "dead_letter_policy": st.one_of(
            st.none(), junk,
            st.fixed_dictionaries({"dead_letter_topic": st.sampled_from(["dlq", "missing", "projects/fz/topics/a\n", ""])},
                                  optional={"max_delivery_attempts": st.one_of(st.integers(-1, 120), junk)})),
        "filter": st.one_of(st.sampled_from(['attributes.k = "v"', 'hasPrefix(attributes.k, "a")', "attributes:k AND", "x" * 257, ""]),
                            st.text(max_size=10), junk),
        "expiration_policy": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"ttl": durations}), junk),
        "message_retention_duration": st.one_of(st.none(), durations),
        "retain_acked_messages": st.one_of(st.booleans(), junk),
        "enable_exactly_once_delivery": st.one_of(st.booleans(), junk),
    },
)


def _resolve(world: World, request: dict[str, Any]) -> dict[str, Any]:
    out = dict(request)
    if out["name"] == "fresh":
        out["name"] = world.fresh("subscriptions")
    if out["topic"] in ("base", "missing"):
        out["topic"] = world.topic if out["topic"] == "base" else f"projects/{PROJECT}/topics/missing"
    dead = out.get("dead_letter_policy")
    if isinstance(dead, dict) and dead.get("dead_letter_topic") in ("dlq", "missing"):
        out["dead_letter_policy"] = {**dead, "dead_letter_topic": f"projects/{PROJECT}/topics/{dead['dead_letter_topic']}"}
    return out


SUB_FIELDS = ("name", "topic", "push_config", "ack_deadline_seconds", "labels", "enable_message_ordering", "retry_policy",
              "dead_letter_policy", "filter", "expiration_policy", "message_retention_duration", "retain_acked_messages",
              "enable_exactly_once_delivery", "request")


@FUZZ
@given(st.one_of(good_creates, create_requests))
@example({"name": "fresh", "topic": "base", "push_config": {"push_endpoint": "https://example.com/p", "attributes": "ab"}})
@example({"name": "fresh", "topic": "base", "labels": {"x": 1, 2: "y"}})
@example({"name": "fresh", "topic": "base", "push_config": {"push_endpoint": "http://127.0.0.1:8/x"}})  # http needs allow_http
@example({"name": "fresh", "topic": "base", "dead_letter_policy": {"dead_letter_topic": "missing"}})
@example({"name": "fresh", "topic": "missing"})
@example({"name": "fresh", "topic": "base", "ack_deadline_seconds": 45, "labels": {"team": "data"}, "filter": 'attributes.k = "v"',
          "retry_policy": {"minimum_backoff": 5}, "dead_letter_policy": {"dead_letter_topic": "dlq", "max_delivery_attempts": 7},
          "push_config": {"push_endpoint": "https://example.com/p", "oidc_token": {"service_account_email": "sa@p.iam"}}})
def test_create_subscription(world: World, request: dict[str, Any]) -> None:
    request = _resolve(world, request)
    kind, got = outcome(world, lambda: world.sub.create_subscription(request=request), SUB_FIELDS)
    if kind != "ok":
        if isinstance(got, NotFound):  # only for a topic (or dead-letter topic) that does not exist
            assert "topic" in got.kind and got.name.endswith("/missing")
        return
    assert world.sub.get_subscription(subscription=got.name) == got
    assert got.name == request["name"] and got.topic == request["topic"]
    assert dict(got.labels) == dict(request.get("labels") or {})
    assert got.ack_deadline_seconds == (request.get("ack_deadline_seconds") or 10)
    assert got.filter == (request.get("filter") or "")
    push = request.get("push_config") or {}
    assert got.push_config.push_endpoint == (push.get("push_endpoint") or "")
    assert got.push_config.push_endpoint == "" or got.push_config.push_endpoint.lower().startswith("https:")
    if request.get("dead_letter_policy"):
        assert got.dead_letter_policy is not None and got.dead_letter_policy.dead_letter_topic == world.dlq
    assert bool(got.enable_message_ordering) == bool(request.get("enable_message_ordering"))


UPDATABLE = ["ack_deadline_seconds", "labels", "push_config", "retry_policy", "dead_letter_policy", "expiration_policy",
             "message_retention_duration", "retain_acked_messages", "enable_exactly_once_delivery", "filter", "name", "bogus"]


@FUZZ
@given(st.one_of(good_creates, create_requests), st.lists(st.sampled_from(UPDATABLE), min_size=0, max_size=3, unique=True))
def test_update_subscription(world: World, values: dict[str, Any], mask: list[str]) -> None:
    body = {**_resolve(world, values), "name": world.updated}
    body.pop("topic")
    kind, got = outcome(world, lambda: world.sub.update_subscription(subscription=body, update_mask=mask),
                        ("subscription", "update_mask") + SUB_FIELDS)
    if kind == "ok":
        assert world.sub.get_subscription(subscription=world.updated) == got
        if "labels" in mask:
            assert dict(got.labels) == dict(body.get("labels") or {})
        if "ack_deadline_seconds" in mask:
            assert got.ack_deadline_seconds == (body.get("ack_deadline_seconds") or 10)
    if kind == "ok":  # back to a plain pull subscription for the next example
        world.sub.update_subscription(subscription={"name": world.updated, "push_config": None,
                                                    "enable_exactly_once_delivery": False},
                                      update_mask=["enable_exactly_once_delivery", "push_config"])


@FUZZ
@given(st.one_of(st.just("updated"), st.just("missing"), bad_ids, junk), push_configs)
def test_modify_push_config(world: World, which: Any, push: Any) -> None:
    name = {"updated": world.updated, "missing": f"projects/{PROJECT}/subscriptions/missing"}.get(which, which) \
        if isinstance(which, str) else which
    kind, _ = outcome(world, lambda: world.sub.modify_push_config(subscription=name, push_config=push), ("subscription", "push_config"))
    if kind == "ok":
        got = world.sub.get_subscription(subscription=world.updated).push_config
        assert got.push_endpoint == ((push or {}).get("push_endpoint") or "")
        world.sub.modify_push_config(subscription=world.updated, push_config={})


# -- publishing and pulling ----------------------------------------------------------------------
attr_keys = st.one_of(st.text(max_size=8), st.sampled_from(["goog-x", "", "k" * 257]))
attr_values = st.one_of(st.text(max_size=8), st.just("v" * 1025))
good_messages = st.fixed_dictionaries(
    {"data": st.binary(min_size=1, max_size=16)},
    optional={"attributes": st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: not k.startswith("goog")),
                                            st.text(max_size=8), max_size=3),
              "ordering_key": st.text(max_size=6)},
)
messages = st.one_of(
    good_messages, good_messages,
    st.fixed_dictionaries({}, optional={
        "data": st.one_of(st.binary(max_size=16), junk),
        "attributes": st.one_of(st.dictionaries(attr_keys, attr_values, max_size=3), junk),
        "ordering_key": st.one_of(st.text(max_size=6), st.just("k" * 1025), junk),
        "bogus": junk,
    }),
    junk,
)


def _pull_all(world: World, n: int) -> dict[str, types.PubsubMessage]:
    got: dict[str, types.PubsubMessage] = {}
    for _ in range(5):
        rs = world.sub.pull(subscription=world.subscription, max_messages=1000, return_immediately=True).received_messages
        if rs:
            world.sub.acknowledge(subscription=world.subscription, ack_ids=[r.ack_id for r in rs])
        got.update({r.message.message_id: r.message for r in rs})
        if len(got) >= n:
            break
    return got


@settings(FUZZ, max_examples=25)
@given(st.one_of(st.lists(messages, min_size=1, max_size=3), st.lists(messages, max_size=3), junk))
@example([{"data": b"x" * 10_000_001}])
@example([{"data": b"ok"}, {"data": "text"}])
@example([{"data": b"", "attributes": {}}])
@example([{"data": b"x", "attributes": {"k": "\ud800"}}])
@example([{"data": b"\x00\xff", "attributes": {"k": "v", "é": ""}, "ordering_key": "key-1"}])
def test_publish_batch(world: World, batch: Any) -> None:
    kind, got = outcome(world, lambda: world.pub.publish_batch(world.topic, batch), ("messages",))
    if kind != "ok":
        assert isinstance(got, InvalidArgument)
        return
    pulled = _pull_all(world, len(got))
    assert sorted(pulled) == sorted(got)
    for message_id, m in zip(got, batch):
        back = pulled[message_id]
        assert back.data == bytes(m.get("data", b"")) and dict(back.attributes) == dict(m.get("attributes") or {})
        assert back.ordering_key == (m.get("ordering_key") or "")


@settings(FUZZ, max_examples=25)
@given(st.one_of(
    st.tuples(st.binary(min_size=1, max_size=16),
              st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True).filter(lambda k: not k.startswith("goog")), st.text(max_size=6), max_size=2),
              st.text(max_size=6)),
    st.tuples(st.one_of(st.binary(max_size=16), junk), st.dictionaries(attr_keys, st.one_of(attr_values, junk), max_size=2),
              st.one_of(st.text(max_size=6), junk)),
))
@example((b"x", {}, "k" * 1025))
@example((b"x", {"goog": "v"}, ""))
def test_publish(world: World, message: tuple[Any, dict[str, Any], Any]) -> None:
    data, attrs, okey = message
    kind, got = outcome(world, lambda: world.opub.publish(world.topic, data, okey, **attrs), ("message",))
    if kind != "ok":
        assert isinstance(got, InvalidArgument)
        return
    message_id = got.result(timeout=30)
    back = _pull_all(world, 1)[message_id]
    assert (back.data, dict(back.attributes), back.ordering_key) == (bytes(data), attrs, okey or "")


# -- acks, deadlines, pull, seek ---------------------------------------------------------------
ack_ids = st.one_of(
    st.lists(st.one_of(st.text("abs_-0123456789.\n", max_size=24), junk), max_size=3),
    # Well-formed: of another subscription ("s7"), or of this one ("UID", replaced) naming no delivery.
    st.lists(st.builds(lambda a, b, c: f"{a}.{b}.{c}", st.sampled_from(["s7", "UID"]), st.integers(0, 10**12), st.integers(0, 3)),
             min_size=1, max_size=2),
    junk,
)


@FUZZ
@given(ack_ids, st.one_of(st.just("base"), st.just("missing"), bad_ids, junk))
@example(["abc.1.1\n"], "base")
@example([], "base")
@example("abc.1.1", "base")
def test_acknowledge(world: World, ids: Any, which: Any) -> None:
    ids = world.with_uid(ids)
    name = {"base": world.subscription, "missing": f"projects/{PROJECT}/subscriptions/missing"}.get(which, which) \
        if isinstance(which, str) else which
    before = tree_digest(world.warehouse)
    outcome(world, lambda: world.sub.acknowledge(subscription=name, ack_ids=ids), ("subscription", "ack_ids"))
    # Well-formed ids that name no delivery are ignored, as Pub/Sub does: nothing is written either.
    assert tree_digest(world.warehouse) == before


@FUZZ
@given(ack_ids, st.one_of(st.integers(-10, 1000), junk))
@example(["abc.1.1"], 601)
@example(["abc.1.1"], -1)
@example(["abc.1.1"], True)
def test_modify_ack_deadline(world: World, ids: Any, seconds: Any) -> None:
    ids = world.with_uid(ids)
    before = tree_digest(world.warehouse)
    kind, got = outcome(world, lambda: world.sub.modify_ack_deadline(subscription=world.subscription, ack_ids=ids, ack_deadline_seconds=seconds),
                        ("subscription", "ack_ids", "ack_deadline_seconds"))
    if kind == "ok":
        assert isinstance(seconds, int) and not isinstance(seconds, bool) and 0 <= seconds <= 600
    assert tree_digest(world.warehouse) == before


@FUZZ
@given(st.one_of(st.integers(-5, 20_000), junk), st.one_of(st.none(), st.floats(max_value=0), st.integers(-3, 0), junk))
def test_pull_arguments(world: World, n: Any, timeout: Any) -> None:
    # The subscription's backlog is empty: a good pull returns nothing and writes nothing.
    kind, got = outcome(world, lambda: world.sub.pull(subscription=world.subscription, max_messages=n, return_immediately=True,
                                                      timeout=timeout), ("max_messages", "timeout"))
    assert kind == "refused" or got.received_messages == []


@FUZZ
@given(st.one_of(st.floats(), st.integers(-(10**20), 10**20), st.text("0123456789-T:Z.", max_size=22), junk,
                 st.datetimes(min_value=dt.datetime(1, 1, 2), timezones=st.just(dt.timezone.utc))),
       st.one_of(st.none(), st.text(max_size=6), junk))
@example(1e300, None)
@example(-1e300, None)
@example(None, None)
@example(None, "projects/fz/snapshots/missing")
def test_seek(world: World, when: Any, snapshot: Any) -> None:
    kind, got = outcome(world, lambda: world.sub.seek(subscription=world.subscription, time=when, snapshot=snapshot),
                        ("seek", "time", "snapshot"))
    if kind == "refused" and isinstance(got, NotFound):
        assert got.kind == "snapshot"


@FUZZ
@given(st.one_of(ids.map(lambda i: f"projects/{PROJECT}/snapshots/{i}"), bad_ids, junk), labels,
       st.sampled_from(["base", "missing", "bad"]))
def test_create_snapshot(world: World, name: Any, lbls: Any, which: str) -> None:
    sub = {"base": world.subscription, "missing": f"projects/{PROJECT}/subscriptions/missing", "bad": "subs/x"}[which]
    kind, got = outcome(world, lambda: world.sub.create_snapshot(request={"name": name, "subscription": sub, "labels": lbls}),
                        ("name", "labels", "subscription"))
    if kind == "ok":
        assert world.sub.get_snapshot(snapshot=name) == got and dict(got.labels) == dict(lbls or {})
        world.sub.delete_snapshot(snapshot=name)


@FUZZ
@given(st.sampled_from(["list_topics", "list_subscriptions", "list_snapshots", "list_topic_subscriptions"]),
       st.one_of(st.text(max_size=20), junk), st.one_of(st.integers(-3, 2000), junk), st.one_of(st.just("p"), bad_ids, junk))
def test_listings(world: World, method: str, token: Any, size: Any, scope: Any) -> None:
    client = world.pub if method in ("list_topics", "list_topic_subscriptions") else world.sub
    key = "topic" if method == "list_topic_subscriptions" else "project"
    value = (world.topic if key == "topic" else PROJECT) if scope == "p" else scope
    request = {key: value, "page_size": size, "page_token": token}
    outcome(world, lambda: list(getattr(client, method)(request=request)), (key, "page_size", "page_token", "topic", "project"))


@FUZZ
@given(st.sampled_from(["create_topic", "get_topic", "delete_topic", "get_subscription", "delete_subscription", "pull",
                        "detach_subscription", "get_snapshot", "delete_snapshot"]),
       st.dictionaries(st.one_of(st.sampled_from(["name", "topic", "subscription", "snapshot", "max_messages"]), keys), junk, max_size=3))
@example("get_topic", {"topic": "projects/fz/topics/abc\n"})
@example("delete_topic", {"topic": 5})
@example("get_topic", {1: "x", "y": 2})
def test_any_request_dict(world: World, method: str, request: dict[Any, Any]) -> None:
    client = world.pub if method in ("create_topic", "get_topic", "delete_topic", "detach_subscription") else world.sub
    kind, got = outcome(world, lambda: getattr(client, method)(request=request),
                        ("request", "name", "topic", "subscription", "snapshot", "max_messages"))
    assert kind == "refused" or method in ("get_topic", "get_subscription", "get_snapshot"), (method, request, got)


# -- client settings -----------------------------------------------------------------------------
@settings(FUZZ, max_examples=25)
@given(st.one_of(st.lists(st.one_of(st.integers(-2, 2000), st.floats(), junk), max_size=7), junk),
       st.one_of(st.just(print), junk), st.sampled_from(["base", "missing", "bad"]))
@example(5, print, "base")  # FlowControl(*5): TypeError
@example([1] * 6, print, "base")  # too many fields: TypeError
@example({"max_messages": 3}, print, "base")
def test_subscribe_arguments(world: World, flow: Any, callback: Any, which: str) -> None:
    name = {"base": world.subscription, "missing": f"projects/{PROJECT}/subscriptions/missing", "bad": "x"}[which]
    kind, got = outcome(world, lambda: world.sub.subscribe(name, callback, flow_control=flow), ("flow_control", "callback", "subscription"))
    if kind == "ok":
        got.cancel()
        assert got.result(timeout=30) is True


@settings(FUZZ, max_examples=20)
@given(st.one_of(st.lists(junk, max_size=3), junk), st.fixed_dictionaries({}, optional={
    "max_bytes": st.one_of(st.integers(-1, 10**7), junk), "max_latency": st.one_of(st.floats(), junk),
    "max_messages": st.one_of(st.integers(-1, 200_000), junk)}))
@example((True, 1), {})  # PublisherOptions(True, 1): TypeError
@example((), {"max_latency": float("inf")})
def test_publisher_options(world: World, options: Any, batch: dict[str, Any]) -> None:
    def make() -> PublisherClient:
        return PublisherClient(warehouse=world.warehouse, publisher_options=options, batch_settings=types.BatchSettings(**batch))

    kind, got = outcome(world, make, ("publisher_options", "batch_settings"))
    if kind == "ok":
        got.stop()
