"""Compile a parsed subscription filter (``filter_syntax``) to vectorised forms.

Contract:

- ``attributes_mask(expr, attributes)``: a boolean mask (no nulls) over an Arrow column of
  ``map<string, string>`` attributes, True where the message matches. Whole columns are
  evaluated with Arrow compute kernels, one ``map_lookup`` per distinct key: no Python loop
  per message. A null map (no attributes) is a message with no keys.
- ``compile_filter(text)``: the function fan-out applies to its rows (a table with an
  ``attributes`` column); None for the empty filter (no filter). ``compiled_filter`` is the
  same, cached per filter text.
- ``to_sql(expr, column)``: the same filter as a Spark SQL boolean expression over a map
  column, for paths that filter in Spark; it is never null either.

Semantics (Pub/Sub's): ``attributes:K`` is "K is a key"; ``attributes.K = "v"`` is "K is a
key whose value is v"; ``!=`` is the negation of ``=`` (so true when K is missing);
``hasPrefix(attributes.K, "p")`` is "K is a key whose value starts with p"; NOT, AND and OR
are two-valued (a missing key is false, never unknown). Attribute values are never null in
messages (the publisher refuses them), so "K is a key" is "the lookup of K is not null".
Pure: no I/O, no clock.
"""

from __future__ import annotations

from functools import lru_cache, reduce
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from .filter_syntax import And, Compare, CompareOp, FilterExpr, HasKey, HasPrefix, Not, Or, parse

__all__ = ["FilterMask", "attributes_mask", "compile_filter", "compiled_filter", "to_sql"]

# rows with an ``attributes`` column -> boolean mask (True = the message matches).
FilterMask = Callable[[pa.Table], pa.Array]


def attributes_mask(expr: FilterExpr, attributes: pa.Array | pa.ChunkedArray) -> pa.Array:
    """True where the attributes match `expr` (never null), as one boolean Array."""
    lookups: dict[str, pa.Array] = {}  # Arrays or ChunkedArrays, as `attributes` is

    def value(key: str) -> pa.Array:
        if key not in lookups:
            lookups[key] = pc.map_lookup(attributes, pa.scalar(key, pa.string()), "first")
        return lookups[key]

    def false_if_null(mask: pa.Array) -> pa.Array:
        return pc.fill_null(mask, False)

    def ev(e: FilterExpr) -> pa.Array:
        if isinstance(e, HasKey):
            return pc.is_valid(value(e.key))
        if isinstance(e, Compare):
            equal = false_if_null(pc.equal(value(e.key), pa.scalar(e.value, pa.string())))
            return equal if e.op is CompareOp.EQ else pc.invert(equal)
        if isinstance(e, HasPrefix):
            return false_if_null(pc.starts_with(value(e.key), pattern=e.prefix))
        if isinstance(e, Not):
            return pc.invert(ev(e.operand))
        if isinstance(e, And):
            return reduce(pc.and_, (ev(o) for o in e.operands))
        if isinstance(e, Or):
            return reduce(pc.or_, (ev(o) for o in e.operands))
        raise TypeError(f"not a filter expression: {e!r}")

    if len(attributes) == 0:
        return pa.array([], pa.bool_())
    mask = ev(expr)
    return mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask


def compile_filter(text: str | None, column: str = "attributes") -> FilterMask | None:
    """The mask function of a filter text (parsed once, here); None when `text` is empty.
    Raises InvalidArgument("filter", ...) for an invalid filter."""
    if not text:
        return None
    expr = parse(text)

    def mask(rows: pa.Table) -> pa.Array:
        return attributes_mask(expr, rows[column])

    return mask


@lru_cache(maxsize=1024)
def compiled_filter(text: str) -> FilterMask | None:
    """``compile_filter(text)``, parsed once per process for each distinct filter (every pull
    and push batch asks for its subscription's hooks)."""
    return compile_filter(text)


def _sql_string(value: str) -> str:
    """A Spark SQL string literal of `value` (single quotes; backslash and quote escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_sql(expr: FilterExpr, column: str = "attributes") -> str:
    """`expr` as a Spark SQL boolean expression over the map column `column` (never null).
    ``try_element_at`` gives null for a missing key whether or not ANSI mode is on."""

    def value(key: str) -> str:
        return f"try_element_at({column}, {_sql_string(key)})"

    def ev(e: FilterExpr) -> str:
        if isinstance(e, HasKey):
            return f"({value(e.key)} IS NOT NULL)"
        if isinstance(e, Compare):
            equal = f"coalesce({value(e.key)} = {_sql_string(e.value)}, false)"
            return f"({equal})" if e.op is CompareOp.EQ else f"(NOT {equal})"
        if isinstance(e, HasPrefix):
            return f"coalesce(startswith({value(e.key)}, {_sql_string(e.prefix)}), false)"
        if isinstance(e, Not):
            return f"(NOT {ev(e.operand)})"
        if isinstance(e, And):
            return "(" + " AND ".join(ev(o) for o in e.operands) + ")"
        if isinstance(e, Or):
            return "(" + " OR ".join(ev(o) for o in e.operands) + ")"
        raise TypeError(f"not a filter expression: {e!r}")

    return ev(expr)
