"""Reading the payloads of leased messages from the messages table (pull and push alike)."""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .. import ackid
from ..storage import Engine
from ..storage.engine import read_by_ids
from ..storage.tables import MESSAGES
from ..types import PubsubMessage, ReceivedMessage
from .model import Lease

log = logging.getLogger(__name__)


def read_payloads(engine: Engine, topic_uid: str, message_ids: pa.Array) -> pa.Table:
    """message_id, data, attributes, ordering_key, publish_time of the given messages (any order)."""
    columns = ["message_id", "data", "attributes", "ordering_key", "publish_time"]
    if len(message_ids) == 0:
        return pa.table({c: pa.array([], MESSAGES.schema.field(c).type) for c in columns})
    # The cost follows the lease count, not the topic's file count (read_by_ids).
    return read_by_ids(engine.snapshot(MESSAGES.name), message_ids, columns, partition=topic_uid)


def fetch_messages(engine: Engine, topic_uid: str, message_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Payloads of the given messages from the messages table, keyed by message_id."""
    if not message_ids:
        return {}
    table = read_payloads(engine, topic_uid, pa.array(list(message_ids), pa.string()))
    return {row["message_id"]: row for row in table.to_pylist()}


def received_messages(
    sub_uid: str, sub_name: str, leases: Iterable[Lease], payloads: Mapping[str, Mapping[str, Any]], *, with_attempts: bool
) -> list[ReceivedMessage]:
    """The leases as pull responses' messages, in order, from their payload rows (keyed by
    message_id). A lease whose payload is gone (retention) is logged and left out: its lease
    expires. `with_attempts`: fill delivery_attempt (else 0, as Pub/Sub does without a
    dead-letter policy)."""
    out: list[ReceivedMessage] = []
    for lease in leases:
        row = payloads.get(lease.message_id)
        if row is None:
            log.error("message %s of %s has no payload in the messages table", lease.message_id, sub_name)
            continue
        msg = PubsubMessage(
            data=row["data"] or b"",
            attributes=dict(row["attributes"] or []),
            message_id=lease.message_id,
            publish_time=row["publish_time"],
            ordering_key=row["ordering_key"] or "",
        )
        out.append(ReceivedMessage(ackid.encode(sub_uid, lease.message_id, lease.delivery_attempt, lease.message_version), msg,
                                   lease.delivery_attempt if with_attempts else 0))
    return out
