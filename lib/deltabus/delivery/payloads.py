"""Reading the payloads of leased messages from the messages table (pull and push alike)."""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..storage import Engine
from ..storage.tables import MESSAGES


def read_payloads(engine: Engine, topic_uid: str, message_ids: pa.Array) -> pa.Table:
    """message_id, data, attributes, ordering_key, publish_time of the given messages (any order)."""
    columns = ["message_id", "data", "attributes", "ordering_key", "publish_time"]
    if len(message_ids) == 0:
        return pa.table({c: pa.array([], MESSAGES.schema.field(c).type) for c in columns})
    ids = pc.unique(message_ids)
    lo, hi = pc.min(ids).as_py(), pc.max(ids).as_py()

    def outside(actions: pa.Table) -> pa.Array:
        """Files whose message_id range misses [lo, hi] (from the log's statistics)."""
        return pc.or_(pc.less(actions["max.message_id"], lo), pc.greater(actions["min.message_id"], hi))

    # Opens only the files whose id range overlaps the wanted ids, lowest first, and stops
    # once all are found: the cost follows the lease count, not the topic's file count.
    return engine.snapshot(MESSAGES.name).read_first(
        len(ids), [("message_id", "ascending")], columns, partition=topic_uid,
        filter=pc.field("message_id").isin(ids), skip_files=outside,
    )


def fetch_messages(engine: Engine, topic_uid: str, message_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Payloads of the given messages from the messages table, keyed by message_id."""
    if not message_ids:
        return {}
    table = read_payloads(engine, topic_uid, pa.array(list(message_ids), pa.string()))
    return {row["message_id"]: row for row in table.to_pylist()}
