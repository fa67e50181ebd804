"""SQL over a warehouse: topics, subscriptions, messages, deliveries, backlog and snapshots as views.

Columns follow Pub/Sub's resource fields. Internal uids are hidden; a subscription whose
topic was deleted shows ``_deleted-topic_``. ``snapshots`` adds what Pub/Sub's Snapshot
does not show: the source subscription, and how many unacked messages it holds. Views are
evaluated at query time, so every query sees the tables' latest versions.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..config import EngineName
from ..names import DELETED_TOPIC
from ..subscription_fields import VIEW_COLUMNS
from ..storage.tables import ALL, HISTORY_PREFIX
from . import table_source

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

# delivery_health: the outcomes that end an attempt, and those that count as a success.
_ENDED = "'push_ok', 'push_failed', 'ack', 'nack', 'expired'"
_SUCCESS = "'push_ok', 'ack'"

VIEWS = {
    "topics": "SELECT name, labels, message_retention_duration, create_time FROM _deltabus_topics",
    # Its columns: the public fields of the one declaration of a subscription's fields.
    "subscriptions": f"""
        SELECT s.name,
               CASE WHEN t.name IS NULL THEN '{DELETED_TOPIC}' ELSE s.topic END AS topic,
               {", ".join(f"s.{c}" for c in VIEW_COLUMNS)}
        FROM _deltabus_subscriptions s LEFT JOIN _deltabus_topics t ON s.topic_uid = t.topic_uid""",
    "messages": """
        SELECT topic, message_id, data, attributes, ordering_key, publish_time, size_bytes
        FROM _deltabus_messages""",
    "deliveries": """
        SELECT s.name AS subscription, d.message_id, d.publish_time, d.ordering_key, d.size_bytes,
               d.delivery_attempt,
               CASE WHEN d.lease_expires < TIMESTAMP'1970-01-02 00:00:00 UTC' THEN NULL ELSE d.lease_expires END AS ack_deadline,
               CASE WHEN d.delivery_attempt = 0 THEN 'undelivered'
                    WHEN d.lease_expires < TIMESTAMP'1970-01-02 00:00:00 UTC' THEN 'nacked'
                    WHEN d.lease_expires > current_timestamp() THEN 'outstanding'
                    ELSE 'expired' END AS state
        FROM _deltabus_deliveries d JOIN _deltabus_subscriptions s ON d.sub_uid = s.sub_uid""",
    # The delivery history (issue 17, ``delivery/history``): the deliveries table's
    # ``_attempts-<yyyy-mm-dd>`` partitions. A filter on `date` prunes whole days.
    "delivery_attempts": f"""
        SELECT attempt_subscription AS subscription, message_id, delivery_attempt AS attempt,
               attempt_outcome AS outcome, attempt_status AS status, attempt_latency_ms AS latency_ms,
               attempt_worker AS worker, attempt_time AS time,
               to_date(substr(sub_uid, {len(HISTORY_PREFIX) + 1})) AS date
        FROM _deltabus_deliveries WHERE substr(sub_uid, 1, {len(HISTORY_PREFIX)}) = '{HISTORY_PREFIX}'""",
    # Per subscription and minute: the attempts that ended (a push answered or failed, a pull's
    # ack, nack or expiry), how many succeeded (push_ok, ack), and push latency percentiles.
    "delivery_health": f"""
        SELECT subscription, date_trunc('MINUTE', time) AS minute,
               count(*) AS attempts,
               count_if(outcome IN ({_SUCCESS})) AS successes,
               count_if(outcome IN ({_SUCCESS})) / count(*) AS success_rate,
               percentile_approx(latency_ms, 0.5) AS latency_p50_ms,
               percentile_approx(latency_ms, 0.9) AS latency_p90_ms,
               percentile_approx(latency_ms, 0.99) AS latency_p99_ms
        FROM delivery_attempts WHERE outcome IN ({_ENDED})
        GROUP BY subscription, date_trunc('MINUTE', time)""",
    # The messages attempted most, per subscription: highest attempt number first.
    "most_attempted_messages": f"""
        SELECT subscription, message_id, max(attempt) AS attempts,
               count_if(outcome IN ({_ENDED}) AND outcome NOT IN ({_SUCCESS})) AS failures,
               min(time) AS first_time, max(time) AS last_time,
               max_by(outcome, time) AS last_outcome, max_by(status, time) AS last_status
        FROM delivery_attempts
        GROUP BY subscription, message_id
        ORDER BY attempts DESC, failures DESC, last_time DESC""",
    "backlog": "SELECT * FROM _deltabus_backlog",
    "backlog_history": "SELECT *, num_undelivered_messages + num_outstanding_messages + expired_ack_deadlines AS num_unacked_messages FROM _deltabus_backlog_history",
    # messages: the snapshot's stored unacked messages (those published after it are not counted).
    "snapshots": """
        SELECT n.name, n.topic, n.subscription, n.labels, n.create_time, n.expire_time,
               COALESCE(m.messages, CAST(0 AS BIGINT)) AS messages, n.oldest_publish_time
        FROM _deltabus_snapshots n
        LEFT JOIN (SELECT snapshot_uid, count(*) AS messages FROM _deltabus_snapshot_messages GROUP BY snapshot_uid) m
          ON n.snapshot_uid = m.snapshot_uid""",
}




def register(spark: "SparkSession", warehouse: str, *, engine: EngineName = "auto") -> str:
    """Define the views on `spark`; return which reader backs them ("delta-spark" or "delta-rs").

    delta-spark: each table view is ``delta.`<uri>``` , Spark's own Delta reader (its scan,
    file pruning and statistics). delta-rs: this package's Python source reading through
    delta-rs (``table_source``), for a Spark without the Delta jars. `engine` "auto" is
    delta-spark when `spark` has the Delta JVM classes (``storage.choose_engine``); asking for
    delta-spark without them raises ``FailedPrecondition``."""
    from ..storage import choose_engine

    if "://" not in warehouse:
        warehouse = os.path.abspath(warehouse)
    warehouse = warehouse.rstrip("/")
    use_delta = choose_engine(engine, spark) == "delta-spark"
    from . import streaming

    # spark.readStream.format("deltabus"): a subscription as a stream (issue 17). Its nack-on-failure
    # listener only with deltabus.spark.register_sources(spark): no Python callbacks in jobs that stream nothing.
    streaming.register_source(spark)
    if not use_delta:
        table_source.register(spark)
    for spec in ALL:
        uri = f"{warehouse}/{spec.name}".replace("'", "\\'")
        # Defined in SQL, so the relation is resolved again by every query: each query reads
        # the table's latest version (a DataFrame would pin the version it was planned at).
        if use_delta:
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW _deltabus_{spec.name} AS SELECT * FROM delta.`{uri}`")
        else:
            spark.sql(
                f"CREATE OR REPLACE TEMPORARY VIEW _deltabus_{spec.name} "
                f"USING {table_source.NAME} OPTIONS (path '{uri}', table '{spec.name}')"
            )
    for name, query in VIEWS.items():
        spark.sql(f"CREATE OR REPLACE TEMP VIEW {name} AS {query}")
    return "delta-spark" if use_delta else "delta-rs"


def session(
    warehouse: str,
    *,
    spark: "SparkSession | None" = None,
    app_name: str = "deltabus",
    refresh_backlog: bool = True,
    create: bool = False,
) -> "SparkSession":
    """A SparkSession on which topics, subscriptions, messages, deliveries, backlog and snapshots are queryable.

    With `refresh_backlog` (the default) the backlog table is recomputed first, so ``backlog``
    answers for pull-only warehouses too (a running push job also rewrites it every second).

    A missing warehouse raises ``WarehouseNotFound`` and nothing is created, so a mistyped
    path is an error rather than an empty set of views; ``create=True`` (a notebook setting
    up a fresh warehouse) creates it."""
    from ..backlog import refresh
    from ..registry import Registry
    from ..storage import open_engine

    engine = open_engine(warehouse, engine="delta-rs", create=create)
    if refresh_backlog:
        refresh(engine, Registry(engine, clock=time.time).subscriptions().values(), time.time())
    if spark is None:
        from pyspark.sql import SparkSession

        from ..config import spark_workers_use_this_python

        spark_workers_use_this_python()

        spark = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC").getOrCreate()
    register(spark, warehouse)
    return spark
