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

from typing import Callable, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot
from .cursor import FANOUT_COLUMNS, cursor_app_id, empty_fanout, pending_range, read_cursor, read_unfanned
from .hooks import FanoutFilter

# At most this many messages-table versions are fanned out in one call.
MAX_FANOUT_VERSIONS = 500

# A subscription catching up from the change feed with a `limit` (``catch_up``) first
# reads this many versions, and from their rows per version how many more it needs.
PROBE_VERSIONS = 8
# How much a lagging subscription fans out when it leases up to `room` messages
# (``catch_up_rows``): CATCH_UP_ROOMS times that, at least CATCH_UP_MIN (the push job), or
# at least PULL_CATCH_UP_MIN for a pull or a server round. Why the larger floor there
# (measured, bench/server.py's pull phase, 20,000 messages published before 1 and 4
# subscribe() clients with FlowControl 1,000, twice each): fanning out 2,000 per round made
# rounds fan out ten times, 1,641 / 1,590 and 4,334 / 4,283 msg/s against 1,778 / 1,813 and
# 4,687 / 4,618 msg/s with one fan-out of all 20,000; a fan-out of 20,000 rows is one
# append of tens of ms, far from the 500,000 rows the limit is there to prevent.
CATCH_UP_ROOMS = 2
CATCH_UP_MIN = 1_000
PULL_CATCH_UP_MIN = 20_000

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


def catch_up_rows(room: int, ordered: bool, cap: int | None = None, floor: int = CATCH_UP_MIN) -> int | None:
    """The most messages a lagging subscription fans out when it may lease `room` now:
    CATCH_UP_ROOMS times that, at least `floor` (also with no room: a subscription in
    push backoff or with a full window still moves its cursor on, so messages past their
    retention reach its deliveries, where maintenance drops them, and other topics'
    versions are passed), at most `cap`. None (no limit) with ordering keys: a held key
    can leave room that only later messages fill. Pure."""
    if ordered:
        return None
    rows = max(floor, CATCH_UP_ROOMS * max(0, room))
    return rows if cap is None else min(cap, rows)


def from_change_feed(
    engine: Engine, snap: Snapshot, sub: SubscriptionRecord, *, keep: FanoutFilter | None = None, limit: int | None = None
) -> Fanout:
    """The next messages after sub's cursor in `snap`, up to MAX_FANOUT_VERSIONS versions;
    with `limit`, at most that many (``catch_up``)."""
    cursor, latest = pending_range(engine, snap, sub)
    if limit is not None:
        return catch_up(engine, sub, cursor, latest, limit, keep)
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
    limit: int | None = None,
    strict: bool = False,
) -> Fanout:
    """Messages of sub's topic after its cursor, up to version `last`, for a micro-batch
    covering versions first..last. `limit` (None: no limit): a subscription catching up
    fans out at most that many messages (``catch_up``, with `strict`).

    In the steady state the cursor is the batch's start and the rows come from the
    stream's micro-batch; a subscription that lags (new, or switched from pull) catches
    up from the change feed first (at most MAX_FANOUT_VERSIONS versions per batch). A
    subscription with a filter reads the change feed too unless the batch carries
    ``attributes`` (the stream's rows do not): one read of the batch's versions of its topic.
    """
    cursor = read_cursor(snap, sub)
    if cursor >= last:
        return Fanout(empty_fanout(), cursor, cursor)
    if cursor < first and limit is not None:
        return catch_up(engine, sub, cursor, last, limit, keep, strict=strict)
    if cursor < first or (keep is not None and "attributes" not in batch.column_names):
        end = min(last, cursor + MAX_FANOUT_VERSIONS)
        return Fanout(prepare(read_unfanned(engine, sub, cursor + 1, end, attributes=keep is not None), keep), cursor, end)
    return Fanout(prepare(batch_rows(batch, sub.topic_uid, cursor), keep), cursor, last)


def catch_up(
    engine: Engine,
    sub: SubscriptionRecord,
    cursor: int,
    last: int,
    limit: int,
    keep: FanoutFilter | None = None,
    *,
    strict: bool = False,
    read: Callable[[int, int], pa.Table] | None = None,
) -> Fanout:
    """The next messages after `cursor` (up to version `last` and MAX_FANOUT_VERSIONS
    versions) that the filter keeps, but only whole versions and no more than `limit` of
    them, unless the first version alone holds more (so the cursor always moves when there
    is anything to fan out; `strict`: then nothing, the cursor stays). `limit` 0: nothing
    is read and the cursor stays. Versions whose messages the filter drops all are covered
    as they come. `read(first, last)`: the unfanned rows of versions first..last as
    ``read_unfanned`` returns them (default: that, from the change feed). Reads
    PROBE_VERSIONS versions, then as many more as the kept rows per version read so far say
    `limit` needs, at least twice the span read so far after a read that kept nothing.

    Why (bench/run.py scale, 10M messages published in 10,000 versions of 1,000): a job
    started on that backlog fanned out 500 versions, 500,000 rows, per micro-batch while
    its window pushed ~2,500 messages a batch, and a batch that large grants no leases
    (lease_start): cost per pushed message 3.6x that of a 10k backlog."""
    end = min(last, cursor + MAX_FANOUT_VERSIONS)
    if limit <= 0 or end <= cursor:
        return Fanout(empty_fanout(), cursor, cursor)
    if read is None:
        attributes = keep is not None

        def read(a: int, b: int) -> pa.Table:
            return read_unfanned(engine, sub, a, b, attributes=attributes)

    def kept(rows: pa.Table) -> pa.Table:
        return rows.filter(keep(rows)) if keep is not None and rows.num_rows else rows

    upto = min(end, cursor + PROBE_VERSIONS)
    parts = [kept(read(cursor + 1, upto))]
    have = parts[0].num_rows
    while have < limit and upto < end:
        span = upto - cursor
        estimate = int((limit - have) / (have / span)) if have else 0
        step = max(1, estimate, span if parts[-1].num_rows == 0 else 0)
        more = min(end, upto + step)
        parts.append(kept(read(upto + 1, more)))
        have += parts[-1].num_rows
        upto = more
    rows = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    if rows.num_rows > limit:
        upto = whole_versions(rows["message_version"], limit, cursor, strict=strict)
        rows = rows.filter(pc.less_equal(rows["message_version"], upto))
    return Fanout(prepare(rows), cursor, upto)


def whole_versions(versions: pa.ChunkedArray | pa.Array, limit: int, cursor: int, *, strict: bool = False) -> int:
    """The last version to fan out of rows from `versions` (each row's messages-table
    version, all > `cursor`): the highest V whose rows at or below it number at most
    `limit`, or the lowest version present when even its rows alone are more (`strict`:
    then `cursor`, nothing). Pure."""
    counts = pc.value_counts(versions)
    pairs = sorted(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))
    if not pairs or (strict and pairs[0][1] > limit):
        return cursor
    total, chosen = 0, pairs[0][0]
    for version, n in pairs:
        total += n
        if total > limit:
            break
        chosen = version
    return max(int(chosen), cursor + 1)
