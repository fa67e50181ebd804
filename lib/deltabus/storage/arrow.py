"""Arrow helpers: delta-rs hands back view types; Spark and our code want plain ones."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), plain_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(plain_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, plain_type(f.type), f.nullable) for f in t])
    return t


def plain(data: Any) -> pa.Table:
    """Convert any Arrow-exportable table (arro3, reader, pyarrow) to a pyarrow table of plain types."""
    table = data if isinstance(data, pa.Table) else pa.table(data)
    target = pa.schema([pa.field(f.name, plain_type(f.type), f.nullable) for f in table.schema])
    return table if target == table.schema else table.cast(target)
