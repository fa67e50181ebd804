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


def dataset(dt: Any, uri: str, prune: str | None = None) -> Any:
    """A pyarrow dataset over a DeltaTable that is safe to use in any process.

    delta-rs's default filesystem handler is implemented in Python; when Arrow's I/O
    threads still reference it at interpreter exit, the process aborts ("terminate called
    without an active exception", measured in about half of short-lived CLI runs). Local
    tables get Arrow's native filesystem instead; other URIs keep delta-rs's handler, and
    their scans must run with use_threads=False (see ``scan``).
    """
    import pyarrow.fs as pafs

    if "://" not in uri or uri.startswith("file://"):
        root = uri.removeprefix("file://")
        return dt.to_pyarrow_dataset(file_pruning_predicate=prune, filesystem=pafs.SubTreeFileSystem(root, pafs.LocalFileSystem()))
    return dt.to_pyarrow_dataset(file_pruning_predicate=prune)


def scan_threads(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def read_table(uri: str, columns: list[str] | None = None) -> pa.Table:
    """The latest version of a Delta table as a plain pyarrow table (a one-off read)."""
    from .log_repair import open_table

    dt = open_table(uri)
    return plain(dataset(dt, uri).to_table(columns=columns, use_threads=scan_threads(uri)))
