"""Spark integration. Importing this package never starts a SparkSession.

``deltabus.spark.session(warehouse=...)`` returns a SparkSession on which the warehouse's
tables are queryable by name: topics, subscriptions, messages, deliveries, backlog,
backlog_history, snapshots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession


def session(
    warehouse: str,
    *,
    spark: "SparkSession | None" = None,
    app_name: str = "deltabus",
    refresh_backlog: bool = True,
    create: bool = False,
) -> "SparkSession":
    """See ``deltabus.spark.sql.session``: SQL views over the warehouse's tables."""
    from .sql import session as _session

    return _session(warehouse, spark=spark, app_name=app_name, refresh_backlog=refresh_backlog, create=create)


def active_session() -> "SparkSession | None":
    """This thread's active SparkSession, or None (also when pyspark was never imported: then
    no session can exist, and importing pyspark just to ask would cost a second).

    For entry points (client constructors) that pick an engine "auto"matically; library code
    below them is handed the session explicitly."""
    import sys

    if "pyspark" not in sys.modules:
        return None
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def __getattr__(name: str) -> Any:  # lazy: keep `import deltabus.spark` free of pyspark imports
    if name == "register_views":
        from .sql import register

        return register
    if name == "register_sources":  # format("deltabus") on a session deltabus did not make
        from .streaming import register as register_sources

        return register_sources
    raise AttributeError(name)
