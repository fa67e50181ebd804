"""Property-based fuzzing of the pure validators (issue 16, "Bad input, fuzzed").

Every validator either returns a clean value or raises ``InvalidArgument`` naming the
field it was given (or a sub-field of it); no other exception, whatever the input. Good
inputs round-trip. The cases fuzzing found are pinned as ``@example``s.

Derandomized with small example counts: the same cases on every run, a few seconds in all.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import math
import re
from typing import Any, Callable

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deltabus import ackid, names, pagination, subscription_fields
from deltabus.cli import _seek_time
from deltabus.errors import InvalidArgument
from deltabus.jsonl import FIELDS, LineError, parse_line, read_lines
from deltabus.policy import filter_syntax
from deltabus.types import (
    DeadLetterPolicy,
    ExpirationPolicy,
    PushConfig,
    RetryPolicy,
    duration_seconds,
    timestamp_seconds,
    validate_ack_deadline,
    validate_labels,
    validate_subscription_retention,
    validate_topic_retention,
)
from deltabus.validation import check_message, check_push_endpoint

FUZZ = settings(
    max_examples=50, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Anything a caller might pass where a value is expected.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.binary(max_size=20),
    st.timedeltas(), st.datetimes(),
)
keys = st.one_of(st.text(max_size=8), st.integers(-3, 3), st.none())  # mixed key types: sorted() of them raised TypeError
junk = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=8,
)


def refused_naming(field: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn's value, or None when it raised InvalidArgument naming `field` or a sub-field of it.
    Any other exception fails the test (hypothesis reports the input)."""
    try:
        return fn(*args, **kwargs)
    except InvalidArgument as exc:
        assert exc.field == field or exc.field.startswith((field + ".", field + "[")), (exc.field, field, exc.rule)
        assert exc.rule and "\n" not in exc.rule, exc.rule
        return None


# -- resource names --------------------------------------------------------------------------------
ID_CHARS = "abcXYZ019-_.~+%"
valid_ids = st.from_regex(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,40}", fullmatch=True).filter(lambda s: not s.startswith("goog"))
valid_projects = st.from_regex(r"[A-Za-z][A-Za-z0-9\-_.]{0,20}", fullmatch=True)
name_like = st.builds(
    lambda p, c, i: f"projects/{p}/{c}/{i}",
    st.text(ID_CHARS + "/\n é", max_size=8), st.sampled_from(["topics", "subscriptions", "snapshots", "topic", ""]),
    st.text(ID_CHARS + "/\n é", max_size=12),
)


@FUZZ
@given(st.one_of(name_like, st.text(max_size=30), junk))
@example("projects/p/topics/abc\n")  # `$` matched before a final newline: this was accepted
@example("projects/p\n/topics/abc")
@example("projects/p/topics/goog-abc")
def test_topic_names_are_parsed_or_refused_by_field(name: Any) -> None:
    got = refused_naming("topic", names.parse_topic, name, "topic")
    if got is not None:
        assert str(got) == name
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9\-_.]{0,62}", got.project)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}", got.resource_id) and not got.resource_id.startswith("goog")


@FUZZ
@given(valid_projects, valid_ids, st.sampled_from(["topics", "subscriptions", "snapshots"]))
def test_valid_names_round_trip(project: str, resource_id: str, collection: str) -> None:
    path = {"topics": names.topic_path, "subscriptions": names.subscription_path, "snapshots": names.snapshot_path}[collection]
    name = path(project, resource_id)
    assert names.parse(name, collection, "name") == (project, collection, resource_id)


@FUZZ
@given(st.one_of(st.text(ID_CHARS + "/\n", max_size=12), junk))
@example("local\n")
@example("projects/")
def test_projects_are_parsed_or_refused_by_field(project: Any) -> None:
    got = refused_naming("project", names.parse_project, project)
    if got is not None:
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9\-_.]{0,62}", got)


# -- ack ids ---------------------------------------------------------------------------------------
ack_like = st.text("abc_-0123456789.\n ", max_size=30)


@FUZZ
@given(st.one_of(ack_like, st.text(max_size=30), junk))
@example("abc.1.1\n")  # `$` again: a trailing newline decoded
@example("abc.1.0")
@example("abc.1.2147483648")
@example("abc.1.1.-5")
def test_ack_ids_decode_or_are_refused_by_field(value: Any) -> None:
    got = refused_naming("ack_ids[3]", ackid.decode, value, "ack_ids[3]")
    if got is not None:
        assert re.fullmatch(r"[A-Za-z0-9_\-]+", got.sub_uid) and re.fullmatch(r"[0-9]{1,40}", got.message_id)
        assert 1 <= got.delivery_attempt <= ackid.MAX_ATTEMPT


@FUZZ
@given(
    st.from_regex(r"[A-Za-z0-9_\-]{1,20}", fullmatch=True), st.from_regex(r"[0-9]{1,40}", fullmatch=True),
    st.integers(1, ackid.MAX_ATTEMPT), st.one_of(st.none(), st.integers(-(10**18), 10**18)),
)
def test_ack_ids_round_trip(sub_uid: str, message_id: str, attempt: int, version: int | None) -> None:
    assert ackid.decode(ackid.encode(sub_uid, message_id, attempt, version)) == (sub_uid, message_id, attempt, version)


# -- messages --------------------------------------------------------------------------------------
attr_text = st.one_of(st.text(max_size=12), st.sampled_from(["goog", "googx", "", "k" * 257, "v" * 1025, "\ud800"]))
attributes = st.one_of(st.dictionaries(attr_text, attr_text, max_size=4), st.dictionaries(keys, junk, max_size=2), junk)


@FUZZ
@given(st.one_of(st.binary(max_size=20), junk), attributes, st.one_of(st.text(max_size=8), st.just("k" * 1025), junk))
@example(b"", {}, "")
@example(b"x", {"k": "\udc80"}, "")
@example(b"x", {}, "\ud800")
@example(memoryview(b"abcd").cast("I"), {}, "")
def test_messages_are_sized_or_refused_by_field(data: Any, attrs: Any, okey: Any) -> None:
    size = refused_naming("messages[0]", check_message, data, attrs, okey, where="messages[0]")
    if size is not None:
        expected = memoryview(data).nbytes + sum(len(k.encode()) + len(v.encode()) for k, v in (attrs or {}).items())
        assert size == expected


# -- push endpoints and configs --------------------------------------------------------------------
urls = st.builds(
    lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
    st.sampled_from(["https://", "http://", "HTTPS://", "ftp://", "https:/", "", "https://user:pw@", "//"]),
    st.one_of(st.text("abc.-_0123456789[]:%@ é\t", max_size=16), st.sampled_from(["example.com", "[::1]", "127.0.0.1", "1.2.3"])),
    st.one_of(st.just(""), st.integers(-5, 70_000).map(lambda p: f":{p}"), st.text(":x0", max_size=4)),
    st.text("/?#=&%a\n", max_size=8),
)


@FUZZ
@given(st.one_of(urls, st.text(max_size=30)))
@example("https://example.com:0/")
@example("https://example.com:65536/")
@example("https://[::1/")
@example("https://a..b/")
@example("https://example.com/\n")
def test_push_endpoints_are_kept_or_refused_by_field(url: str) -> None:
    got = refused_naming("push_config.push_endpoint", check_push_endpoint, url)
    if got is not None:
        import yarl

        assert got == url
        parsed = yarl.URL(url)
        assert parsed.scheme in ("http", "https") and parsed.raw_host
        assert not re.search(r"[\s\x00-\x1f\x7f#]", url) and parsed.user is None


push_configs = st.one_of(
    junk,
    st.fixed_dictionaries(
        {},
        optional={
            "push_endpoint": st.one_of(st.sampled_from(["https://example.com/p", "http://127.0.0.1:8/x", ""]), urls, junk),
            "attributes": st.one_of(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2), junk),
            "oidc_token": st.one_of(
                st.fixed_dictionaries({}, optional={"service_account_email": st.one_of(st.just("sa@p.iam"), st.text(max_size=8), junk),
                                                     "audience": st.one_of(st.text(max_size=8), junk)}),
                junk,
            ),
            "no_wrapper": st.one_of(st.fixed_dictionaries({}, optional={"write_metadata": junk}), junk),
            "pubsub_wrapper": junk,
        },
    ),
)


@FUZZ
@given(push_configs)
@example({"push_endpoint": "https://example.com/p", "attributes": "ab"})  # dict("ab"): ValueError, not InvalidArgument
@example({"push_endpoint": "https://example.com/p", "attributes": [1]})  # dict([1]): TypeError
@example({"push_endpoint": "https://example.com/p", "oidc_token": {"service_account_email": "sa@p\n"}})
def test_push_configs_are_coerced_or_refused_by_field(value: Any) -> None:
    got = refused_naming("push_config", PushConfig.coerce, value)
    if got is not None and isinstance(value, dict):  # a good config round-trips
        assert got.push_endpoint == (value.get("push_endpoint") or "")
        assert dict(got.attributes) == dict(value.get("attributes") or {})


# -- labels, deadlines, durations, times -----------------------------------------------------------
label_text = st.text("abcz09_-A é\n", max_size=10)


@FUZZ
@given(st.one_of(st.dictionaries(label_text, label_text, max_size=4), st.dictionaries(keys, junk, max_size=2), junk))
@example({"team\n": "data"})  # accepted through `$`
@example({"team": "data\n"})
@example({f"k{i}": "" for i in range(65)})
def test_labels_are_kept_or_refused_by_field(labels: Any) -> None:
    got = refused_naming("labels", validate_labels, labels)
    if got is not None:
        assert got == dict(labels or {})
        for k, v in got.items():
            assert re.fullmatch(r"[a-z][a-z0-9_\-]{0,62}", k) and re.fullmatch(r"[a-z0-9_\-]{0,63}", v)


@FUZZ
@given(st.one_of(st.integers(-1000, 1000), junk))
def test_ack_deadlines_are_kept_or_refused_by_field(value: Any) -> None:
    got = refused_naming("ack_deadline_seconds", validate_ack_deadline, value)
    if got is not None:
        assert 10 <= got <= 600 and (got == value or value in (0, None))


durations = st.one_of(
    junk, st.text("0123456789.es -naif", max_size=8),
    st.fixed_dictionaries({}, optional={"seconds": st.one_of(st.integers(), st.integers(-(10**400), 10**400), junk),
                                        "nanos": st.one_of(st.integers(), junk), "x": junk}),
)


@FUZZ
@given(durations)
@example(10**400)  # float(10**400): OverflowError
@example({"seconds": 10**400})
@example("1e400s")
@example("nan")
def test_durations_are_seconds_or_refused_by_field(value: Any) -> None:
    got = refused_naming("retry_policy.minimum_backoff", duration_seconds, value, "retry_policy.minimum_backoff")
    if got is not None:
        assert isinstance(got, float) and math.isfinite(got)


@FUZZ
@given(st.one_of(durations, st.text("0123456789-T:Zz.+ ", max_size=26), st.datetimes(timezones=st.just(dt.timezone.utc))))
@example(10**400)
@example(1e300)  # finite, but no datetime or Arrow timestamp holds it
@example({"seconds": 10**30})
@example("9999-12-31T23:59:59Z")
def test_times_are_seconds_or_refused_by_field(value: Any) -> None:
    got = refused_naming("time", timestamp_seconds, value, "time")
    if got is not None:
        assert isinstance(got, float) and math.isfinite(got)
        dt.datetime.fromtimestamp(got, dt.timezone.utc)  # representable (seek turns it into a timestamp)


@FUZZ
@given(st.one_of(junk, st.fixed_dictionaries({}, optional={"minimum_backoff": durations, "maximum_backoff": durations, "x": junk})))
@example({"minimum_backoff": 10**400})
@example({"maximum_backoff": 5})  # the error named minimum_backoff, which was not given
def test_retry_policies_are_coerced_or_refused_by_field(value: Any) -> None:
    try:
        RetryPolicy.coerce(value)
    except InvalidArgument as exc:  # names a field that was given (or the policy itself)
        assert exc.field == "retry_policy" or exc.field.removeprefix("retry_policy.") in value, (exc.field, value)
    got = refused_naming("retry_policy", RetryPolicy.coerce, value)
    if got is not None:
        assert 0 <= got.minimum_backoff <= got.maximum_backoff <= 600
        assert RetryPolicy.coerce({"minimum_backoff": got.minimum_backoff, "maximum_backoff": got.maximum_backoff}) == got


@FUZZ
@given(st.one_of(junk, st.fixed_dictionaries({}, optional={
    "dead_letter_topic": st.one_of(st.just("projects/p/topics/dlq"), name_like, junk),
    "max_delivery_attempts": st.one_of(st.integers(-10, 200), junk), "x": junk})))
def test_dead_letter_policies_are_coerced_or_refused_by_field(value: Any) -> None:
    got = refused_naming("dead_letter_policy", DeadLetterPolicy.coerce, value)
    if got is not None:
        assert 5 <= got.max_delivery_attempts <= 100
        names.parse_topic(got.dead_letter_topic)


@FUZZ
@given(st.one_of(junk, st.fixed_dictionaries({}, optional={"ttl": durations, "x": junk})))
@example({"ttl": 10**400})
@example({"x": 1, 2: 3})  # unknown keys of two types: sorted() raised TypeError
def test_expiration_policies_and_retention_are_coerced_or_refused_by_field(value: Any) -> None:
    got = refused_naming("expiration_policy", ExpirationPolicy.coerce, value)
    if got is not None:
        assert got.ttl is None or 86_400 <= got.ttl <= 365 * 86_400
    kept = refused_naming("message_retention_duration", validate_subscription_retention, value)
    assert kept is None or 600 <= kept <= 7 * 86_400
    topic_kept = refused_naming("message_retention_duration", validate_topic_retention, value)
    assert topic_kept is None or 600 <= topic_kept <= 31 * 86_400


# -- filters ---------------------------------------------------------------------------------------
filter_words = st.lists(
    st.sampled_from(['attributes.k', 'attributes:k', '=', '!=', '"v"', '"', 'hasPrefix(', ')', '(', 'NOT', '-', 'AND', 'OR',
                     'and', ',', 'attributes."a b"', '"\\u00e9"', '"\\x4"', "'", "\\", "é", " "]),
    max_size=8,
).map(" ".join)


@FUZZ
@given(st.one_of(filter_words, st.text(max_size=20)))
@example('attributes.k = "v"')
@example('"\\777"')
def test_filters_parse_or_are_refused_by_field(text: str) -> None:
    refused_naming("filter", filter_syntax.parse, text, "filter")


# -- a whole create request ------------------------------------------------------------------------
create_fields = st.fixed_dictionaries(
    {"name": st.one_of(st.just("projects/p/subscriptions/sub"), name_like, junk),
     "topic": st.one_of(st.just("projects/p/topics/top"), name_like, junk)},
    optional={
        "push_config": push_configs, "ack_deadline_seconds": st.one_of(st.integers(-5, 700), junk),
        "labels": st.one_of(st.dictionaries(label_text, label_text, max_size=2), junk),
        "enable_message_ordering": junk, "retry_policy": junk, "dead_letter_policy": junk, "filter": st.one_of(filter_words, junk),
        "expiration_policy": junk, "message_retention_duration": durations, "retain_acked_messages": junk,
        "enable_exactly_once_delivery": junk,
    },
)


@FUZZ
@given(create_fields)
def test_create_requests_are_settled_or_refused_by_field(given_fields: dict[str, Any]) -> None:
    try:
        settings_ = subscription_fields.create_settings(given_fields)
    except InvalidArgument as exc:
        top = re.split(r"[.\[]", exc.field, maxsplit=1)[0]
        assert top in given_fields or top in {f.name for f in subscription_fields.SETTABLE}, exc.field
        return
    assert settings_.name == given_fields["name"] and settings_.topic == given_fields["topic"]


# -- publish --file lines --------------------------------------------------------------------------
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)
line_objects = st.dictionaries(
    st.one_of(st.sampled_from(FIELDS), st.text(max_size=6)),
    st.one_of(json_values, st.text("ABCabc012+/=", max_size=12), st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
    max_size=4,
)


@FUZZ
@given(st.one_of(line_objects.map(json.dumps), st.text(max_size=30), json_values.map(json.dumps)))
@example('{"data": "x", "data": "y"}')
@example('{"data_base64": "AAE"}')
@example('{"data": NaN}')
@example('{"attributes": {"goog": "x"}}')
def test_jsonl_lines_parse_or_are_refused_naming_line_and_field(text: str) -> None:
    try:
        got = parse_line(text, "f.jsonl:7")
    except InvalidArgument as exc:
        assert exc.field == "f.jsonl:7" or exc.field.startswith("f.jsonl:7: "), exc.field
        return
    if got is None:
        assert not text.strip()
        return
    data, attrs, okey = got
    obj = json.loads(text)
    if isinstance(obj.get("data"), str):
        assert data == obj["data"].encode()
    elif "data_base64" in obj:
        assert data == base64.b64decode(obj["data_base64"])
    assert attrs == obj.get("attributes", {}) and okey == obj.get("ordering_key", "")


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=20), line_objects.map(lambda o: json.dumps(o).encode())), max_size=4))
@example([b'\xef\xbb\xbf{"data": "bom"}\n', b"\xff\n"])
def test_jsonl_files_are_read_or_refused_naming_the_line(raw: list[bytes]) -> None:
    try:
        got = read_lines(raw, "f.jsonl")
    except LineError as exc:
        assert re.fullmatch(r"f\.jsonl:[1-9][0-9]*(: .*)?", exc.field, re.S), exc.field
        return
    assert [g.number for g in got] == sorted(g.number for g in got)


# -- page tokens, CLI durations and times ----------------------------------------------------------
@FUZZ
@given(st.one_of(st.text(max_size=30), junk, st.builds(lambda o: base64.urlsafe_b64encode(json.dumps(o).encode()).decode(), json_values)))
@example(pagination.encode_token("topics", "projects/other", "x"))
@example(base64.urlsafe_b64encode(b'{"v":1,"a":5}').decode())
def test_page_tokens_decode_or_are_refused_by_field(token: Any) -> None:
    got = refused_naming("page_token", pagination.decode_token, token, "topics", "projects/p")
    assert got is None or isinstance(got, str)
    size = refused_naming("page_size", pagination.page_size, token)
    assert size is None or 1 <= size <= pagination.MAX_PAGE_SIZE


@FUZZ
@given(st.text("0123456789.smhdDNEVRinf -", max_size=10))
@example("1e400d")
@example("never")
def test_cli_durations_parse_or_are_usage_errors(text: str) -> None:
    for parse in (subscription_fields.parse_duration, subscription_fields.parse_ttl):
        try:
            parse(text)
        except argparse.ArgumentTypeError:
            pass


@FUZZ
@given(st.text("0123456789-T:Zz.+ smhd", max_size=24))
@example("-1e400d")
@example("-99999999999999999999d")  # finite, but before year 1: no timestamp holds it
@example("9999-12-31T23:59:59Z")
def test_seek_times_are_times_or_refused_naming_the_flag(text: str) -> None:
    at = refused_naming("--time", _seek_time, text, 1.8e9)
    if at is not None:
        dt.datetime.fromtimestamp(at, dt.timezone.utc)



# -- client settings -------------------------------------------------------------------------------
numbers = st.one_of(st.integers(-5, 10**9), st.floats(), junk)


@FUZZ
@given(st.fixed_dictionaries({}, optional={"max_bytes": numbers, "max_latency": numbers, "max_messages": numbers}))
@example({"max_latency": math.inf})  # the batcher's Condition.wait(inf) raised OverflowError in its thread: publishes hung
@example({"max_latency": math.nan})  # never due: the batcher spun without sending
def test_batch_settings_are_kept_or_refused_by_field(values: dict[str, Any]) -> None:
    from deltabus.types import BatchSettings

    got = refused_naming("batch_settings", BatchSettings, **values)
    if got is not None:
        assert math.isfinite(got.max_latency) and got.max_latency >= 0 and got.max_bytes >= 1 and 1 <= got.max_messages <= 100_000
