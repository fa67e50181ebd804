"""Turning validated messages into one append to the messages table.

Contract: one publish time and one message-id prefix per batch; the publish time is
stored as microseconds rounded by ``timestamps.to_us`` (the one rounding rule), and the
ids sort in publish order. Validation happens before: these functions trust their input.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import pyarrow as pa

from .. import ids
from ..storage import Engine
from ..storage.tables import MESSAGES
from ..timestamps import to_us


class OutgoingMessage(NamedTuple):
    data: bytes
    attributes: Mapping[str, str]
    ordering_key: str
    size: int


def build_rows(topic_uid: str, topic: str, messages: Sequence[OutgoingMessage], publish_time: float) -> tuple[pa.Table, list[str]]:
    """Rows for validated messages, and their ids in order."""
    payload = pa.table(
        {
            "data": pa.array([bytes(m.data) for m in messages], pa.binary()),
            "attributes": pa.array([list(m.attributes.items()) for m in messages], MESSAGES.schema.field("attributes").type),
            "ordering_key": pa.array([m.ordering_key for m in messages], pa.string()),
            "size_bytes": pa.array([m.size for m in messages], pa.int64()),
        }
    )
    return from_arrow(topic_uid, topic, payload, publish_time)


def append(engine: Engine, rows: pa.Table) -> None:
    """Append rows built by ``build_rows`` or ``from_arrow`` (appends never conflict in Delta)."""
    engine.append(MESSAGES.name, rows)


def from_arrow(topic_uid: str, topic: str, table: pa.Table, publish_time: float) -> tuple[pa.Table, list[str]]:
    """Rows for a validated Arrow table with columns data, attributes, ordering_key, size_bytes;
    and the message ids, in row order. One publish time and one id prefix per batch."""
    n = table.num_rows
    time_us = to_us(publish_time)
    message_ids = ids.message_ids(ids.batch_prefix(time_us), n)
    rows = pa.table(
        {
            "topic_uid": pa.array([topic_uid] * n, pa.string()),
            "topic": pa.array([topic] * n, pa.string()),
            "message_id": pa.array(message_ids, pa.string()),
            "data": table["data"],
            "attributes": table["attributes"],
            "ordering_key": table["ordering_key"],
            "publish_time": pa.array([time_us] * n, MESSAGES.schema.field("publish_time").type),
            "size_bytes": table["size_bytes"],
        },
        schema=MESSAGES.schema,
    )
    return rows, message_ids
