"""The declaration of a two-table move (storage/keyed_steps.py): bad fields are refused by name."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltabus.errors import InvalidArgument
from deltabus.storage.keyed_steps import MarkedMove


def carry(rows: pa.Table, key: int) -> pa.Table:
    return rows


GOOD = dict(source="a", partition_column="part", partition="sub-1", mark_column="mark", target="b", app_id="dlq:sub-1", carry=carry)


def test_a_good_move_is_accepted() -> None:
    assert MarkedMove(**GOOD).app_id == "dlq:sub-1"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field, value, rule",
    [
        ("partition", "x'; --", r"must match \[A-Za-z0-9_-\]\+"),
        ("partition", "", r"must match"),
        ("mark_column", "mark = 1 OR 1", "must be an identifier"),
        ("partition_column", "1part", "must be an identifier"),
        ("source", "a b", "must be an identifier"),
        ("target", "a", "must differ from source"),
        ("app_id", "dlq sub", "must match"),
        ("app_id", "", "must match"),
    ],
)
def test_a_bad_field_is_refused_by_name(field: str, value: str, rule: str) -> None:
    with pytest.raises(InvalidArgument, match=rf"^{field}: {rule}") as err:
        MarkedMove(**{**GOOD, field: value})  # type: ignore[arg-type]
    assert err.value.field == field
