import pyarrow as pa
import pytest

from deltabus import InvalidArgument
from deltabus.storage.tables import STR_MAP
from deltabus.validation import (
    MAX_ATTRIBUTE_KEY_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_DATA_BYTES,
    check_arrow,
    check_message,
)


def test_size_counts_data_and_attributes():
    assert check_message(b"abc", {"k": "vv"}, "") == 3 + 1 + 2
    assert check_message(b"", {"k": ""}, None) == 1


def test_limits_are_inclusive():
    check_message(b"x" * MAX_DATA_BYTES, {}, "")
    check_message(b"", {f"k{i}": "v" for i in range(MAX_ATTRIBUTES)}, "")
    check_message(b"", {"k" * MAX_ATTRIBUTE_KEY_BYTES: "v" * MAX_ATTRIBUTE_VALUE_BYTES}, "")


@pytest.mark.parametrize(
    "data, attrs, okey, field, words",
    [
        ("text", {}, "", "message.data", "must be bytes"),
        (b"x" * (MAX_DATA_BYTES + 1), {}, "", "message.data", "at most 10000000 bytes"),
        (b"", {}, "", "message", "non-empty data or at least one attribute"),
        (b"x", {f"k{i}": "v" for i in range(MAX_ATTRIBUTES + 1)}, "", "message.attributes", "at most 100"),
        (b"x", {"k" * (MAX_ATTRIBUTE_KEY_BYTES + 1): "v"}, "", "message.attributes", "at most 256 bytes"),
        (b"x", {"k": "v" * (MAX_ATTRIBUTE_VALUE_BYTES + 1)}, "", "message.attributes['k']", "at most 1024 bytes"),
        (b"x", {"k": 1}, "", "message.attributes['k']", "must be strings"),
        (b"x", {"": "v"}, "", "message.attributes", "must not be empty"),
        (b"x", {"googfoo": "v"}, "", "message.attributes['googfoo']", "reserved"),
        (b"x", [("k", "v")], "", "message.attributes", "must map strings"),
        (b"x", {}, "k" * 1025, "message.ordering_key", "at most 1024 bytes"),
        (b"x", {}, 5, "message.ordering_key", "must be a string"),
    ],
)
def test_each_rule_names_field(data, attrs, okey, field, words):
    with pytest.raises(InvalidArgument) as e:
        check_message(data, attrs, okey)
    assert e.value.field == field
    assert words in e.value.rule


def _table(data, attrs, okeys):
    return pa.table({"data": pa.array(data, pa.binary()), "attributes": pa.array(attrs, STR_MAP), "ordering_key": pa.array(okeys, pa.string())})


def test_arrow_sizes_match_scalar_rule():
    t = _table([b"abc", b"", b"z"], [[("k", "vv")], [("a", "")], None], ["", "", "o"])
    assert check_arrow(t).to_pylist() == [6, 1, 1]


@pytest.mark.parametrize(
    "data, attrs, field, words",
    [
        ([b"ok", b""], [None, None], "dataframe[row 1]", "non-empty data"),
        ([b"ok", b"x"], [None, [("goog", "v")]], "dataframe.attributes[row 1]['goog']", "reserved"),
        ([b"ok", b"x"], [None, [("k", None)]], "dataframe.attributes[row 1]['k']", "must not be null"),
        ([b"ok", b"x"], [None, [("k", "v" * 1025)]], "dataframe.attributes[row 1]['k']", "at most 1024"),
        ([b"ok", b"x"], [None, [(f"k{i}", "v") for i in range(101)]], "dataframe.attributes[row 1]", "at most 100"),
    ],
)
def test_arrow_rules_name_row(data, attrs, field, words):
    with pytest.raises(InvalidArgument) as e:
        check_arrow(_table(data, attrs, ["", ""]))
    assert e.value.field == field
    assert words in e.value.rule


def test_memoryview_size_counts_bytes_not_items():
    import array

    view = memoryview(array.array("q", [0] * 1_300_000))  # 10.4 MB in 1.3M items
    with pytest.raises(InvalidArgument) as e:
        check_message(view, {}, "")
    assert e.value.field == "message.data"


@pytest.mark.parametrize(
    "attrs, okey, field",
    [({"k": "\ud800"}, "", "message.attributes['k']"), ({"\ud800": "v"}, "", "message.attributes"), ({"k": "v"}, "\udfff", "message.ordering_key")],
)
def test_lone_surrogates_are_invalid_argument(attrs, okey, field):
    with pytest.raises(InvalidArgument) as e:
        check_message(b"x", attrs, okey)
    assert e.value.field == field


# -- push endpoints ------------------------------------------------------------------------
from deltabus.types import PushConfig  # noqa: E402
from deltabus.validation import check_push_endpoint  # noqa: E402


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/push",
        "https://example.com:8443/push?token=abc",
        "http://127.0.0.1:8080/p",
        "http://localhost/p",
        "https://[::1]:1/p",
        "https://push.example.com.:65535/",
        "https://bücher.example/p",
    ],
)
def test_good_push_endpoints(url):
    assert check_push_endpoint(url) == url
    assert PushConfig(push_endpoint=url).push_endpoint == url


@pytest.mark.parametrize(
    "url, words",
    [
        ("https://exa mple.com/push", "whitespace"),
        ("https://example.com/push ", "whitespace"),
        ("https://example.com/a\tb", "whitespace"),
        ("https://example.com:99999/push", "port must be a number 1..65535"),
        ("https://example.com:0/push", "port must be a number 1..65535"),
        ("https://example.com:http/push", "port must be a number 1..65535"),
        ("ftp://example.com/push", "http or https"),
        ("example.com/push", "http or https"),
        ("https:///push", "absolute URL with a host"),
        ("https://user:secret@example.com/push", "user:password@"),
        ("https://example.com/push#frag", "fragment"),
        ("https://exa_mple.com/push", "valid host name"),
        ("https://-example.com/push", "valid host name"),
        ("https://example..com/push", "valid host name"),
        ("https://a%20b/push", "valid host name"),
        ("https://300.1.1.1/push", "valid IP address"),
        ("https://[::1/push", "valid URL"),
    ],
)
def test_bad_push_endpoints_name_field_and_rule(url, words):
    for check in (check_push_endpoint, lambda u: PushConfig(push_endpoint=u), lambda u: PushConfig.coerce({"push_endpoint": u})):
        with pytest.raises(InvalidArgument) as e:
            check(url)
        assert e.value.field == "push_config.push_endpoint"
        assert words in e.value.rule


def test_endpoint_errors_never_echo_credentials_or_query_tokens():
    with pytest.raises(InvalidArgument) as e:
        check_push_endpoint("https://user:s3cret@example.com/push")
    assert "s3cret" not in str(e.value)
    with pytest.raises(InvalidArgument) as e:
        check_push_endpoint("https://exa mple.com/push?token=s3cret")
    assert "s3cret" not in str(e.value)


def test_endpoint_scheme_is_lower_cased_and_needs_a_colon():
    from deltabus.validation import endpoint_scheme

    assert endpoint_scheme("HTTPS://x/p") == "https"
    assert endpoint_scheme("Http://x") == "http"
    assert endpoint_scheme("no-scheme") == ""
