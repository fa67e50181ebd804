"""The filter compiler on Arrow columns: Pub/Sub's semantics, whole batches at once."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltabus.errors import InvalidArgument
from deltabus.policy.filter_eval import attributes_mask, compile_filter, to_sql
from deltabus.policy.filter_syntax import parse

ATTRS = pa.map_(pa.string(), pa.string())
MINNA = "\u307f\u3093\u306a"

# The message set of Pub/Sub's Go test server's filter tests (pstest), 1-based.
MESSAGES = [
    {"lang": "en", "name": "com", "timezone": "UTC"},
    {"lang": "en", "name": "net", "timezone": "UTC"},
    {"lang": "en", "name": "org", "timezone": "UTC"},
    {"lang": "cn", "name": "com", "timezone": "UTC"},
    {"lang": "cn", "name": "net", "timezone": "UTC"},
    {"lang": "cn", "name": "org", "timezone": "UTC"},
    {"lang": "jp", "name": "co", "timezone": "UTC"},
    {"lang": "jp", "timezone": "UTC"},
    {"name": "com", "timezone": "UTC"},
    {"lang": "jp", MINNA: "dummy1"},
    {MINNA: "dummy2"},
    {"name": "com", MINNA: "dummy3"},
]

CASES = [
    ('attributes.name = "com"', [1, 4, 9, 12]),
    ('attributes.name != "com"', [2, 3, 5, 6, 7, 8, 10, 11]),
    ('hasPrefix(attributes.name, "co")', [1, 4, 7, 9, 12]),
    ("attributes:name", [1, 2, 3, 4, 5, 6, 7, 9, 12]),
    ("NOT attributes:name", [8, 10, 11]),
    ('(NOT attributes:name) OR attributes.name = "co"', [7, 8, 10, 11]),
    ('NOT (attributes:name OR attributes.lang = "jp")', [11]),
    ('attributes.name = "com" AND -attributes:"lang"', [9, 12]),
    (f'attributes:"{MINNA}"', [10, 11, 12]),
    ('NOT hasPrefix(attributes.name, "co")', [2, 3, 5, 6, 8, 10, 11]),
    ('attributes.lang = "en" AND (attributes.name = "net" OR attributes.name = "org")', [2, 3]),
    ('attributes.lang = "jp" OR attributes.lang = "cn" OR attributes.name = "net"', [2, 4, 5, 6, 7, 8, 10]),
    ('attributes.name = "COM"', []),
    ('hasPrefix(attributes.name, "")', [1, 2, 3, 4, 5, 6, 7, 9, 12]),
]


def column(rows: list[dict[str, str] | None]) -> pa.Array:
    return pa.array([None if r is None else list(r.items()) for r in rows], ATTRS)


@pytest.mark.parametrize("text,expected", CASES, ids=[t for t, _ in CASES])
def test_mask_matches_pubsub(text: str, expected: list[int]) -> None:
    mask = attributes_mask(parse(text), column(MESSAGES))
    assert mask.type == pa.bool_() and mask.null_count == 0
    assert [i + 1 for i, keep in enumerate(mask.to_pylist()) if keep] == expected


def test_null_and_empty_maps_have_no_keys() -> None:
    attrs = column([None, {}, {"k": "v"}])
    assert attributes_mask(parse("attributes:k"), attrs).to_pylist() == [False, False, True]
    assert attributes_mask(parse('attributes.k != "v"'), attrs).to_pylist() == [True, True, False]
    assert attributes_mask(parse('hasPrefix(attributes.k, "v")'), attrs).to_pylist() == [False, False, True]


def test_chunked_columns_and_empty_batches() -> None:
    chunked = pa.chunked_array([column(MESSAGES[:5]), column(MESSAGES[5:])])
    mask = attributes_mask(parse('attributes.name = "com"'), chunked)
    assert isinstance(mask, pa.Array) and mask.to_pylist() == [i + 1 in (1, 4, 9, 12) for i in range(12)]
    assert attributes_mask(parse("attributes:k"), column([])).to_pylist() == []


def test_compile_filter_reads_the_attributes_column_of_rows() -> None:
    assert compile_filter("") is None and compile_filter(None) is None
    keep = compile_filter('attributes.lang = "jp"')
    assert keep is not None
    rows = pa.table({"message_id": [str(i) for i in range(12)], "attributes": column(MESSAGES)})
    assert rows.filter(keep(rows))["message_id"].to_pylist() == ["6", "7", "9"]
    with pytest.raises(InvalidArgument, match="filter: at 1: "):
        compile_filter("bad")


def test_sql_form_escapes_literals() -> None:
    sql = to_sql(parse(r'''attributes."it's" = "a\\b" OR hasPrefix(attributes.k, "x")'''), "attrs")
    assert sql == (
        r"""((coalesce(try_element_at(attrs, 'it\'s') = 'a\\b', false)) OR """
        r"""coalesce(startswith(try_element_at(attrs, 'k'), 'x'), false))"""
    )


def test_fanout_prepare_filters_then_keeps_the_fanout_columns_only() -> None:
    from deltabus.delivery.cursor import FANOUT_COLUMNS, empty_fanout
    from deltabus.delivery.fanout import prepare

    base = empty_fanout()
    n = 4
    rows = pa.table({
        "message_id": ["d", "c", "b", "a"],
        "publish_time": pa.array([0] * n, base.schema.field("publish_time").type),
        "ordering_key": [""] * n,
        "size_bytes": pa.array([1] * n, pa.int64()),
        "message_version": pa.array([2, 1, 2, 1], pa.int64()),
        "attributes": column([{"k": "x"}, {"k": "y"}, None, {"k": "x"}]),
    })
    kept = prepare(rows, compile_filter('attributes.k = "x"'))
    assert kept.column_names == list(FANOUT_COLUMNS)
    assert kept["message_id"].to_pylist() == ["a", "d"]  # by version, then id
    # Rows that carry attributes without a filter lose the column too.
    assert prepare(rows).column_names == list(FANOUT_COLUMNS)
    assert prepare(rows, compile_filter("attributes:none")).num_rows == 0
