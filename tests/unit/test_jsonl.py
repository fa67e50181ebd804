"""The JSON-lines format of `deltabus publish --file`: each rule, named by line and field."""

from __future__ import annotations

import base64
import json

import pytest

from deltabus import InvalidArgument
from deltabus.jsonl import Line, parse_line, read_lines


def lines(*texts: str) -> list[bytes]:
    return [t.encode() + b"\n" for t in texts]


def test_data_forms():
    got = read_lines(lines(
        '{"data": "héllo"}',
        '{"data": {"order": 1, "items": ["a", "é"]}}',
        '{"data": [1, 2]}',
        '{"data_base64": "AAEC"}',
        '{"attributes": {"k": "v"}}',
    ), "f.jsonl")
    assert [g.data for g in got] == [
        "héllo".encode(), '{"order":1,"items":["a","é"]}'.encode(), b"[1,2]", b"\x00\x01\x02", b"",
    ]
    assert got[4].attributes == {"k": "v"}


def test_blank_lines_skipped_and_numbers_kept():
    got = read_lines(lines('{"data": "a"}', "", "   ", '{"data": "b"}'), "f")
    assert [(g.number, g.data) for g in got] == [(1, b"a"), (4, b"b")]


def test_defaults_from_the_command_and_the_line_wins():
    (a, b) = read_lines(lines('{"data": "a"}', '{"data": "b", "attributes": {"src": "line"}, "ordering_key": "k2"}'), "f",
                        attributes={"src": "cli", "env": "prod"}, ordering_key="k1")
    assert a == Line(1, b"a", {"src": "cli", "env": "prod"}, "k1")
    assert b == Line(2, b"b", {"src": "line", "env": "prod"}, "k2")


def test_leading_bom_is_allowed():
    assert read_lines([b'\xef\xbb\xbf{"data": "a"}\n'], "f")[0].data == b"a"


@pytest.mark.parametrize(
    "text, field, words",
    [
        ('{"data": null}', "events.jsonl:3: data", "got null"),
        ('{"data": 42}', "events.jsonl:3: data", "got a number"),
        ('{"data": true}', "events.jsonl:3: data", "got a boolean"),
        ('{"attributes": ["a", "b"]}', "events.jsonl:3: attributes", "must be an object of string values, got an array"),
        ('{"data": "x", "attributes": {"n": 1}}', "events.jsonl:3: attributes", "must be an object of string values ('n' is a number)"),
        ('{"data": "x", "attributes": null}', "events.jsonl:3: attributes", "got null"),
        ('{"data_base64": "not base64!"}', "events.jsonl:3: data_base64", "must be standard base64"),
        ('{"data_base64": 12}', "events.jsonl:3: data_base64", "must be a base64 string"),
        ('{"data": "x", "data_base64": "AAEC"}', "events.jsonl:3: data_base64", "not both"),
        ('{"data": "x", "ordering_key": 5}', "events.jsonl:3: ordering_key", "must be a string"),
        ('{"data": "x", "colour": "red"}', "events.jsonl:3: colour", "unknown field"),
        ('{"data": "x"', "events.jsonl:3", "not valid JSON"),
        ('{"data": NaN}', "events.jsonl:3", "not valid JSON: NaN"),
        ('["data"]', "events.jsonl:3", "must be a JSON object, got an array"),
        ('{"data": "x", "data": "y"}', "events.jsonl:3", "the key 'data' appears twice"),
        ('{"data": "x", "attributes": {"k": "1", "k": "2"}}', "events.jsonl:3", "the key 'k' appears twice"),
        ('{}', "events.jsonl:3: message", "non-empty data or at least one attribute"),
        ('{"data": "x", "attributes": {"googx": "v"}}', "events.jsonl:3: attributes['googx']", "reserved"),
        ('{"data": "\\ud800"}', "events.jsonl:3: data", "lone surrogates"),
    ],
)
def test_each_error_names_line_and_field(text, field, words):
    with pytest.raises(InvalidArgument) as e:
        read_lines(lines('{"data": "ok"}', "", text, '{"data": "after"}'), "events.jsonl")
    assert e.value.field == field
    assert words in e.value.rule
    assert str(e.value).startswith(field + ": ")


def test_not_utf8_names_the_line():
    with pytest.raises(InvalidArgument) as e:
        read_lines([b'{"data": "a"}\n', b'{"data": "\xff"}\n'], "f.jsonl")
    assert e.value.field == "f.jsonl:2" and "not UTF-8" in e.value.rule


def test_parse_line_never_stores_a_python_repr():
    for value in ({"a": 1}, [1, {"b": None}]):
        data, _, _ = parse_line(json.dumps({"data": value}), "f:1")
        assert json.loads(data) == value and b"'" not in data and b"None" not in data


def test_base64_round_trip_of_binary():
    raw = bytes(range(256))
    data, _, _ = parse_line(json.dumps({"data_base64": base64.b64encode(raw).decode()}), "f:1")
    assert data == raw
