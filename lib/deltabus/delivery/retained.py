"""Dropping a subscription's unacked messages once they outlive its retention (issue 15).

Contract: ``drop_expired`` is ONE commit on the subscription's deliveries partition (inside
``engine.transact``: a concurrent pull, ack or push batch conflicts and it reruns) deleting
every row published before ``now - message_retention_duration``, leased or not, as Pub/Sub
discards unacked messages older than the retention. Rows marked for a dead-letter move are
left to that move. It writes through the core's MERGE (``Op.SEEK_DROP`` rows: the row goes
whatever its delivery attempt), so no clause of its own.
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot
from ..storage.tables import DELIVERIES
from ..timestamps import TS, to_us
from .merge import commit, source_rows
from .model import Op


def drop_expired(engine: Engine, sub: SubscriptionRecord, *, clock: Callable[[], float]) -> int:
    """Delete `sub`'s rows published more than its retention ago; return how many went.
    Nothing is written when there are none (a detached subscription has none)."""
    uid = sub.sub_uid

    def fn(snap: Snapshot) -> int:
        cutoff = pa.scalar(to_us(clock() - sub.message_retention_duration), TS)
        rows = snap.read(
            columns=["message_id", "delivery_attempt", "dead_letter_key"], partition=uid,
            filter=pc.field("publish_time") < cutoff,
        )
        rows = rows.filter(pc.is_null(rows["dead_letter_key"]))
        if rows.num_rows == 0:
            return 0
        source = source_rows(Op.SEEK_DROP, uid, rows, rows["delivery_attempt"].cast(pa.int32()), pa.nulls(rows.num_rows, TS))
        m = commit(snap, [source], [uid])
        return int((m or {}).get("num_target_rows_deleted", 0))

    return engine.transact(DELIVERIES.name, fn, what=f"drop the expired messages of {sub.name}")
