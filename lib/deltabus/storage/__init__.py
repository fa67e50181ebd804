"""Storage: one small contract, two engines.

``open_engine`` picks delta-spark when the SparkSession it is given has the Delta JVM
classes (a cluster with io.delta:delta-spark, or ``--packages``), and the embedded delta-rs
engine otherwise. ``engine=`` forces either. Storage looks for no session itself, and only
``open_engine(engine=None)`` consults a setting (DELTABUS_ENGINE, through ``config``): see there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

from ..config import ENGINE_ENV, ENGINES, ConcreteEngine, EngineName, engine_default, engine_name
from ..errors import FailedPrecondition, InvalidArgument, WarehouseNotFound
from .delta_rs import DeltaRsEngine
from .engine import Engine, MatchedDelete, MatchedUpdate, NotMatchedInsert, Snapshot, literal

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

DELTA_PACKAGE_HINT = (
    "run the job with ./spark-submit.sh ... --engine delta-spark, which fetches the Delta jars pinned in "
    "conf/deltabus.conf ([delta-spark] package), or start Spark with them yourself: spark-submit "
    "--packages io.delta:delta-spark_4.1_2.13:<that version> "
    "--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension "
    "--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"
)


def choose_engine(engine: EngineName | None, spark: "SparkSession | None", *, field: str = "engine") -> ConcreteEngine:
    """Which engine `engine` means with `spark` (the caller's session, or None): "delta-rs" or
    "delta-spark". "auto" (and None) is delta-spark when `spark` has the Delta JVM classes.
    Pure: reads no setting; errors name `field` (where the caller got `engine`).

    Storage never looks for a session itself: an entry point that wants the active one asks
    Spark (``deltabus.spark.active_session()``) and passes it."""
    from .delta_spark import delta_jvm_available

    chosen = "auto" if engine is None else engine_name(field, engine)
    if chosen == "delta-rs":
        return chosen
    has_delta = spark is not None and delta_jvm_available(spark)
    if chosen == "auto":
        return "delta-spark" if has_delta else "delta-rs"
    if spark is None:
        raise FailedPrecondition(f"{field}: delta-spark needs a SparkSession (pass spark=, or use the delta-rs engine)")
    if not has_delta:
        raise FailedPrecondition(f"{field}: delta-spark: the Delta JVM classes are not on Spark's classpath; {DELTA_PACKAGE_HINT}")
    return chosen


def _local_path(warehouse: str) -> str | None:
    if warehouse.startswith("file://"):
        return warehouse.removeprefix("file://")
    return None if "://" in warehouse else warehouse


def check_warehouse_path(warehouse: object, field: str = "warehouse") -> str:
    """A warehouse is a non-empty path or URI; a local one is a directory or not there yet.

    Checked before anything is created, so a path that is a file (or lies under one) is a
    clear error instead of delta-rs's "[Errno 17] File exists"."""
    if not isinstance(warehouse, str) or not warehouse:
        raise InvalidArgument(field, "must be a non-empty path or URI")
    local = _local_path(warehouse)
    if local is not None:
        path = os.path.abspath(local)
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            raise InvalidArgument(field, f"must be a directory (or a path to create one), but {path} is a file")
    return warehouse


def warehouse_exists(warehouse: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether any deltabus table is at the warehouse (a partly created one counts: opening completes it)."""
    from deltalake import DeltaTable

    from .tables import ALL

    local = _local_path(warehouse)
    if local is not None and not os.path.isdir(local):
        return False
    base = (os.path.abspath(local) if local is not None else warehouse).rstrip("/")
    opts = dict(storage_options) if storage_options else None
    return any(DeltaTable.is_deltatable(f"{base}/{spec.name}", storage_options=opts) for spec in ALL)


def require_warehouse(
    warehouse: str, storage_options: Mapping[str, str] | None = None, field: str = "warehouse"
) -> str:
    """The warehouse, checked (``check_warehouse_path``) and present; otherwise
    ``WarehouseNotFound`` ("no warehouse at PATH"). Reads nothing else and writes nothing."""
    check_warehouse_path(warehouse, field)
    if not warehouse_exists(warehouse, storage_options):
        raise WarehouseNotFound(warehouse)
    return warehouse


def open_engine(
    warehouse: str,
    *,
    engine: EngineName | None = None,
    storage_options: Mapping[str, str] | None = None,
    spark: "SparkSession | None" = None,
    create: bool = True,
    engine_field: str | None = None,
) -> Engine:
    """Open the warehouse's tables on the chosen engine.

    With ``create`` (jobs, set-up, topic creation) a missing warehouse is created; without
    it a missing one raises ``WarehouseNotFound`` and nothing is written. Either way the
    tables a warehouse of an older version lacks are added. ``engine_field`` names where
    ``engine`` came from in errors (default "engine").

    ``engine=None`` is DELTABUS_ENGINE (else auto), resolved here once (``config.engine_default``;
    errors name the variable): scripts, notebooks and tests call ``open_engine`` as their entry
    point, and e32aae7's contract (test_engine_choice) is that the variable counts for them.
    deltabus's own entry points (clients, jobs, the command line) resolve the setting themselves
    and always pass a name, so nothing below them reads it. ``choose_engine`` reads nothing.
    """
    if create:
        check_warehouse_path(warehouse)
    else:
        require_warehouse(warehouse, storage_options)
    if engine is None:
        engine, engine_field = engine_default(), ENGINE_ENV
    chosen = choose_engine(engine, spark, field=engine_field or "engine")
    store: Engine
    if chosen == "delta-spark":
        from .delta_spark import DeltaSparkEngine

        assert spark is not None  # choose_engine picks delta-spark only with a session
        store = DeltaSparkEngine(warehouse, spark, storage_options=storage_options)
    else:
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
    "check_warehouse_path",
    "warehouse_exists",
    "require_warehouse",
    "choose_engine",
    "ENGINES",
    "DeltaRsEngine",
]
