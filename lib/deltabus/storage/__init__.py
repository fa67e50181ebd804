"""Storage: one small contract, two engines.

``open_engine`` picks the embedded delta-rs engine here; the delta-spark engine plugs in
behind the same ``Engine`` contract where the Delta JVM classes are present.
"""

from __future__ import annotations

from typing import Mapping

from ..errors import InvalidArgument
from .delta_rs import DeltaRsEngine
from .engine import Engine, MatchedDelete, MatchedUpdate, NotMatchedInsert, Snapshot, literal

ENGINES = ("auto", "delta-rs")


def open_engine(
    warehouse: str,
    *,
    engine: str = "auto",
    storage_options: Mapping[str, str] | None = None,
) -> Engine:
    if not isinstance(warehouse, str) or not warehouse:
        raise InvalidArgument("warehouse", "must be a non-empty path or URI")
    if engine not in ENGINES:
        raise InvalidArgument("engine", f"must be one of {ENGINES}, got {engine!r}")
    store = DeltaRsEngine(warehouse, storage_options=storage_options)
    store.ensure_tables()
    return store


__all__ = [
    "Engine",
    "Snapshot",
    "MatchedUpdate",
    "MatchedDelete",
    "NotMatchedInsert",
    "literal",
    "open_engine",
    "DeltaRsEngine",
]
