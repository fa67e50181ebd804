"""Fan-out: the new messages of a subscription, after its cursor.

Contract: a ``Fanout`` is the messages (``FANOUT_COLUMNS``) to insert into one
subscription's deliveries partition, sorted by (message_version, message_id) and passed
through the subscription's filter hook, with the cursor it was read from and the cursor
to commit with them (in the same MERGE). They come from the change feed (pull, and a
push subscription catching up) or from the push stream's micro-batch rows (the push
job's steady state). At most ``MAX_FANOUT_VERSIONS`` versions are read from the change
feed per call. Messages the filter drops are never inserted (so never delivered: acked at
once), and the cursor covers them when it is committed. The filter needs the messages'
``attributes``, which neither FANOUT_COLUMNS nor the push stream's rows carry: with a
filter (only then) fan-out reads them from the change feed, and drops them again after
filtering, so a subscription without a filter reads exactly what it did before. When that happens differs: the
push job commits the cursor with every batch that moves it; pull commits it with its next
write, or alone once it lags ``IDLE_CURSOR_LAG`` versions, so until then a pull with
nothing to lease reads (and filters) the same range again on each poll.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot
from .cursor import FANOUT_COLUMNS, cursor_app_id, empty_fanout, pending_range, read_cursor, read_unfanned
from .hooks import FanoutFilter

# At most this many messages-table versions are fanned out in one call.
MAX_FANOUT_VERSIONS = 500

FANOUT_ORDER = [("message_version", "ascending"), ("message_id", "ascending")]

# The push stream's micro-batch names the messages-table version ``version``.
_BATCH_COLUMNS = ["message_id", "publish_time", "ordering_key", "size_bytes", "version"]


class Fanout(NamedTuple):
    rows: pa.Table  # FANOUT_COLUMNS, in FANOUT_ORDER, filtered
    cursor: int  # the cursor read from the snapshot
    end: int  # the cursor once `rows` are committed (== cursor: nothing to move)

    def txns(self, sub_uid: str) -> list[tuple[str, int]]:
        """The cursor's application transaction to commit with the rows (none if it stays)."""
        return [(cursor_app_id(sub_uid), self.end)] if self.end > self.cursor else []


def prepare(rows: pa.Table, keep: FanoutFilter | None = None) -> pa.Table:
    """Rows in FANOUT_ORDER, without those the filter drops, as FANOUT_COLUMNS (with a
    filter, `rows` carry ``attributes`` too, which the filter reads). Pure."""
    if keep is not None:
        rows = rows.filter(keep(rows))
    if "attributes" in rows.column_names:
        rows = rows.select(list(FANOUT_COLUMNS))
    if rows.num_rows == 0:
        return rows
    return rows.take(pc.sort_indices(rows, FANOUT_ORDER))


def from_change_feed(
    engine: Engine, snap: Snapshot, sub: SubscriptionRecord, *, keep: FanoutFilter | None = None
) -> Fanout:
    """The next messages after sub's cursor in `snap`, up to MAX_FANOUT_VERSIONS versions."""
    cursor, latest = pending_range(engine, snap, sub)
    end = min(latest, cursor + MAX_FANOUT_VERSIONS)
    return Fanout(prepare(read_unfanned(engine, sub, cursor + 1, end, attributes=keep is not None), keep), cursor, end)


def batch_rows(batch: pa.Table, topic_uid: str, after: int) -> pa.Table:
    """The micro-batch's messages of one topic published after version `after`, as
    FANOUT_COLUMNS (the stream's ``version`` renamed at this boundary), plus ``attributes``
    when the batch has them. Pure."""
    mask = pc.and_(pc.equal(batch["topic_uid"], topic_uid), pc.greater(batch["version"], after))
    extra = ["attributes"] if "attributes" in batch.column_names else []
    return batch.filter(mask).select([*_BATCH_COLUMNS, *extra]).rename_columns([*FANOUT_COLUMNS, *extra])


def from_batch(
    engine: Engine,
    snap: Snapshot,
    sub: SubscriptionRecord,
    batch: pa.Table,
    first: int,
    last: int,
    *,
    keep: FanoutFilter | None = None,
) -> Fanout:
    """Messages of sub's topic after its cursor, up to version `last`, for a micro-batch
    covering versions first..last.

    In the steady state the cursor is the batch's start and the rows come from the
    stream's micro-batch; a subscription that lags (new, or switched from pull) catches
    up from the change feed first (at most MAX_FANOUT_VERSIONS versions per batch). A
    subscription with a filter reads the change feed too unless the batch carries
    ``attributes`` (the stream's rows do not): one read of the batch's versions of its topic.
    """
    cursor = read_cursor(snap, sub)
    if cursor >= last:
        return Fanout(empty_fanout(), cursor, cursor)
    if cursor < first or (keep is not None and "attributes" not in batch.column_names):
        end = min(last, cursor + MAX_FANOUT_VERSIONS)
        return Fanout(prepare(read_unfanned(engine, sub, cursor + 1, end, attributes=keep is not None), keep), cursor, end)
    return Fanout(prepare(batch_rows(batch, sub.topic_uid, cursor), keep), cursor, last)
