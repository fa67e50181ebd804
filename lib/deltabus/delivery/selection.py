"""Lease selection: which deliveries get a lease now, and the MERGE source that grants them.

Contract: ``read_available`` reads, from one deliveries snapshot, the rows that may be
leased at `now` (never leased, nacked, or past their deadline), oldest messages first,
opening only the files that can hold such rows, and without the ids the caller excludes
(the push job's in-flight ids). ``select`` is PURE: given those rows, the fanned-out new
messages and the room, it returns the MERGE source parts (LEASE rows for available ones,
INSERT rows for every new message, the first ones leased) and the ``Lease`` records, in
lease order: available rows first, then new messages. The hooks (ordering, attempt
limit) default to leasing everything in that order.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..storage import Snapshot
from ..storage.tables import DELIVERIES
from ..timestamps import TS, to_us, ts_scalar
from ..policy.ordering import NO_KEYS, KeyState, ran_out
from .hooks import DEFAULT_HOOKS, DeliveryHooks, DueFilter
from .merge import NACKED_MAX_US, cascade_rows, source_rows
from .model import Lease, Op

STATE_COLUMNS = ["message_id", "message_version", "publish_time", "delivery_attempt", "lease_expires", "size_bytes"]
AVAILABLE_ORDER = [("message_version", "ascending"), ("message_id", "ascending")]


def available_filter(now: float) -> pc.Expression:
    """Rows available at `now`: never leased (null), nacked, or past their deadline."""
    return pc.field("lease_expires").is_null() | (pc.field("lease_expires") <= ts_scalar(now))


def leased_files(now: float) -> Callable[[pa.Table], pa.Array]:
    """For ``Snapshot.read_first``: files whose every row holds a lease running past `now`
    (no null lease, smallest lease in the future) have nothing available to lease."""

    def skip(actions: pa.Table) -> pa.Array:
        if "min.lease_expires" not in actions.column_names or "null_count.lease_expires" not in actions.column_names:
            return pa.array([False] * actions.num_rows)
        lows = actions["min.lease_expires"]
        at = ts_scalar(now).cast(lows.type)
        return pc.and_(pc.equal(actions["null_count.lease_expires"], 0), pc.greater(lows, at))

    return skip


def empty_available(with_keys: bool = False) -> pa.Table:
    columns = STATE_COLUMNS + ["ordering_key"] if with_keys else STATE_COLUMNS
    return pa.schema([DELIVERIES.schema.field(c) for c in columns]).empty_table()


def read_available(
    snap: Snapshot,
    sub_uid: str,
    now: float,
    limit: int,
    exclude: frozenset[str] = frozenset(),
    due: DueFilter | None = None,
    held: pa.Array | None = None,
) -> pa.Table:
    """The first `limit` deliveries available at `now` that are not in `exclude`, oldest
    messages first (STATE_COLUMNS); reads only the files that can hold them. With
    ``limit <= 0`` it reads nothing and returns no rows (callers need no guard). `due` is
    the subscription's ``DeliveryHooks.due`` (a retry policy's waits); None: the default
    ``available_filter``. Either way a file whose every lease runs past `now` is skipped
    (a policy only ever narrows what is due). `held` (ordering keys: ``read_key_rows``)
    adds the ``ordering_key`` column and leaves out the rows of those keys, so a key whose
    earlier messages are outstanding never crowds the others out of the read."""
    with_keys = held is not None
    if limit <= 0:
        return empty_available(with_keys)
    # Excluded (in-flight) ids are leased, so rarely available; read enough to cover them anyway.
    # Rows marked for a dead-letter move belong to it until it drops them (dead_letter.py).
    unmarked = pc.field("dead_letter_key").is_null()
    if held is not None and len(held):
        key = pc.field("ordering_key").cast(pa.string())
        unmarked = unmarked & (key.is_null() | pc.invert(key.isin(held)))
    rows = snap.read_first(
        limit + len(exclude), AVAILABLE_ORDER, STATE_COLUMNS + ["ordering_key"] if with_keys else STATE_COLUMNS, partition=sub_uid,
        filter=(available_filter(now) if due is None else due(now)) & unmarked, skip_files=leased_files(now),
    )
    if exclude and rows.num_rows:
        rows = rows.filter(pc.invert(pc.is_in(rows["message_id"], pa.array(list(exclude), pa.string()))))
    return rows.slice(0, limit)


KEY_COLUMNS = ["message_id", "message_version", "ordering_key", "delivery_attempt", "lease_expires"]


def read_key_rows(
    snap: Snapshot,
    sub_uid: str,
    now: float,
    exclude: frozenset[str] = frozenset(),
    due: DueFilter | None = None,
    released: frozenset[str] = frozenset(),
) -> tuple[pa.Array, pa.Table]:
    """The ordering state's reads at `now`, in one scan: (held keys, key rows whose lease ran out
    or is running). Held keys (``policy.ordering.KeyState.held``) are the distinct keys of
    the rows that are not due (a lease running, a nack waiting out its retry delay) or are
    in `exclude` (the push job's in-flight ids). The rows (KEY_COLUMNS, lease_expires as
    int64 us, without `exclude` and `released`) are those with a lease running or run out,
    for ``policy.ordering.ran_out``; rows marked for a dead-letter move are left out of them.
    Called only for subscriptions with message ordering, so the default path reads nothing
    more. It reads the keyed rows that are outstanding or whose lease ran out and were not
    leased again yet: its cost follows those, not the backlog of messages never delivered.
    `released`: ids acked in the very MERGE the leases go into (the push job's acks of this
    batch); they hold nothing, so the next message of their key may go in the same commit."""
    waiting = pc.invert(available_filter(now) if due is None else due(now))
    lease = pc.field("lease_expires")
    message_id = pc.field("message_id").cast(pa.string())
    if exclude - released:
        waiting = waiting | message_id.isin(pa.array(sorted(exclude - released), pa.string()))
    if released:
        waiting = waiting & pc.invert(message_id.isin(pa.array(sorted(released), pa.string())))
    # A row marked for a dead-letter move is leaving: it is no run-out head (its move may be
    # unfinished while a follower it let through is rightly leased) and it ends nothing.
    leased = (lease > pa.scalar(NACKED_MAX_US, TS)) & (pc.field("delivery_attempt") >= 1) & pc.field("dead_letter_key").is_null()
    keyed_rows = pc.field("ordering_key").cast(pa.string()) != ""
    rows = snap.read(KEY_COLUMNS + ["dead_letter_key"], partition=sub_uid, filter=lease.is_valid() & keyed_rows & (waiting | leased))
    if rows.num_rows == 0:
        return NO_KEYS.held, NO_ENDED_ROWS
    rows = pa.table({
        "message_id": rows["message_id"].cast(pa.string()),
        "message_version": rows["message_version"].cast(pa.int64()),
        "ordering_key": rows["ordering_key"].cast(pa.string()),
        "delivery_attempt": rows["delivery_attempt"].cast(pa.int32()),
        "lease_expires": rows["lease_expires"].cast(pa.int64()),
        "waiting": _evaluate(rows, waiting),
        "marked": pc.is_valid(rows["dead_letter_key"]),
    })
    held_rows = rows.filter(rows["waiting"])
    held = pc.unique(held_rows["ordering_key"].combine_chunks()) if held_rows.num_rows else NO_KEYS.held
    rows = rows.filter(pc.invert(rows["marked"]))
    gone = exclude | released
    if gone:
        rows = rows.filter(pc.invert(pc.is_in(rows["message_id"], pa.array(sorted(gone), pa.string()))))
    return held, rows.drop_columns(["waiting", "marked"])


NO_ENDED_ROWS = pa.schema(
    [("message_id", pa.string()), ("message_version", pa.int64()), ("ordering_key", pa.string()),
     ("delivery_attempt", pa.int32()), ("lease_expires", pa.int64())]
).empty_table()


def _evaluate(rows: pa.Table, expression: pc.Expression) -> pa.ChunkedArray:
    """`expression` (a filter over deliveries columns) evaluated per row of `rows`, nulls False."""
    marked = rows.append_column("__row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    hit = pc.is_in(marked["__row"], value_set=marked.filter(expression)["__row"].combine_chunks())
    return pa.chunked_array([hit])


# Ordering keys, one message per key (push): how many times the room a read takes of the
# due rows, so a key with many messages due leaves room for the other keys.
ORDERED_READ_FACTOR = 4


def read_candidates(
    snap: Snapshot,
    sub_uid: str,
    now: float,
    room: int,
    hooks: DeliveryHooks,
    exclude: frozenset[str] = frozenset(),
    released: frozenset[str] = frozenset(),
    read_factor: int = 1,
) -> tuple[pa.Table, KeyState]:
    """The due rows ``select`` may lease now (``read_available``) and the ordering state it
    decides with. Without message ordering (``hooks.eligible`` None) it reads nothing more
    and the state is ``NO_KEYS``. With it, the keys held (``read_key_rows``; `released`:
    ids acked in the same MERGE) are read first and their rows left out, `read_factor`
    times the room is read, and the state names the leases a run-out lease ends
    (``policy.ordering.ran_out``). With no room it reads nothing and ends nothing: the
    cascade waits for a decision that can lease."""
    if hooks.eligible is None:
        return read_available(snap, sub_uid, now, room, exclude, due=hooks.due), NO_KEYS
    if room <= 0:  # nothing can be leased: nothing read, nothing ended (the next decision will)
        return empty_available(True), KeyState(NO_KEYS.held, False)
    held, rows = read_key_rows(snap, sub_uid, now, exclude, hooks.due, released)
    limit = room * read_factor
    available = read_available(snap, sub_uid, now, limit, exclude, due=hooks.due, held=held)
    return available, KeyState(held, available.num_rows < limit, ran_out(rows, to_us(now), NACKED_MAX_US))


class Selection(NamedTuple):
    parts: list[pa.Table]  # MERGE source rows (SOURCE_SCHEMA)
    leases: list[Lease]  # in lease order
    inserted: int  # new messages fanned out (leased or not)
    given_up: int  # candidates that reached the attempt limit
    leased_bytes: int = 0  # the leased messages' size_bytes, summed (``select``'s `max_bytes`)
    bytes_blocked: bool = False  # a candidate the room allowed did not fit `max_bytes`: leasing ended there


def _repeat_ts(value_us: int, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value_us, TS), n)


def _leased_prefix(eligible: Sequence[bool] | None, n: int, k: int) -> list[bool]:
    """Which of n new messages are leased: the first k (of the eligible ones)."""
    if eligible is None:
        return [True] * k + [False] * (n - k)
    out: list[bool] = []
    taken = 0
    for ok in eligible:
        take = bool(ok) and taken < k
        taken += take
        out.append(take)
    return out


def _within_bytes(sizes: pa.Array | pa.ChunkedArray, max_bytes: int, oversize_ok: bool) -> int:
    """How many leading `sizes` (null: 0) add up to at most `max_bytes`; at least one when
    `oversize_ok` and there is one (a message larger than the whole cap still goes alone)."""
    if len(sizes) == 0:
        return 0
    total = pc.cumulative_sum(pc.fill_null(sizes, 0).cast(pa.int64()))
    n = int(pc.sum(pc.less_equal(total, max_bytes)).as_py() or 0)
    return max(n, 1) if oversize_ok else n


def select(
    sub_uid: str,
    available: pa.Table,
    fresh: pa.Table,
    room: int,
    expires_us: int,
    hooks: DeliveryHooks = DEFAULT_HOOKS,
    keys: KeyState = NO_KEYS,
    *,
    max_bytes: int | None = None,
    oversize_ok: bool = False,
) -> Selection:
    """Lease up to `room` candidates until `expires_us`: `available` rows first (STATE_COLUMNS,
    in AVAILABLE_ORDER), then `fresh` messages (FANOUT_COLUMNS, in FANOUT_ORDER). Every fresh
    message is inserted; those not leased get attempt 0 and no lease. `keys`: the ordering
    state the eligibility hook decides with (``read_candidates``); its ``ended`` leases
    end in the same MERGE (CASCADE rows). `max_bytes`: the leases' size_bytes add up to at
    most this (in candidate order: the first that does not fit ends the leasing), except
    that with `oversize_ok` the first candidate goes even when it alone is larger. Pure."""
    parts: list[pa.Table] = []
    if keys.ended.num_rows:
        parts.append(cascade_rows(sub_uid, keys.ended))
    room = max(0, room)
    fresh_ok: list[bool] | None = None
    if hooks.eligible is not None and (available.num_rows or fresh.num_rows):
        mask_available, mask_fresh = hooks.eligible(available, fresh, keys)
        available = available.filter(mask_available)
        fresh_ok = [bool(v) for v in mask_fresh.to_pylist()]
    attempts = pc.add(available["delivery_attempt"], pa.scalar(1, pa.int32())).combine_chunks()
    given_up = 0
    if hooks.give_up is not None and available.num_rows:
        stop = hooks.give_up(attempts)
        gone = available.filter(stop)
        given_up = gone.num_rows
        if given_up:
            parts.append(source_rows(Op.GIVE_UP, sub_uid, gone, gone["delivery_attempt"], pa.nulls(given_up, TS)))
            available, attempts = available.filter(pc.invert(stop)), attempts.filter(pc.invert(stop))
    available, attempts = available.slice(0, room), attempts.slice(0, room)
    spent = 0
    bytes_ended = False  # a redelivery did not fit: no fresh message may go ahead of it
    if max_bytes is not None:
        fits = _within_bytes(available["size_bytes"], max_bytes, oversize_ok)
        bytes_ended = fits < available.num_rows
        available, attempts = available.slice(0, fits), attempts.slice(0, fits)
        spent = int(pc.sum(pc.fill_null(available["size_bytes"], 0)).as_py() or 0)
    n = available.num_rows
    if n:
        parts.append(source_rows(Op.LEASE, sub_uid, available, attempts, _repeat_ts(expires_us, n)))
    leases = [
        Lease(m, a, v)
        for m, a, v in zip(available["message_id"].to_pylist(), attempts.to_pylist(), available["message_version"].to_pylist())
    ]
    if fresh.num_rows:
        f, k = fresh.num_rows, (0 if bytes_ended else min(room - n, fresh.num_rows))
        if max_bytes is not None and k > 0:  # the fresh ones leased (in order) fit what is left
            sizes = fresh["size_bytes"] if fresh_ok is None else fresh["size_bytes"].filter(pa.array(fresh_ok, pa.bool_()))
            fit = _within_bytes(sizes.slice(0, k), max_bytes - spent, oversize_ok and n == 0)
            bytes_ended = bytes_ended or fit < min(k, len(sizes))
            k = min(k, fit)
        if fresh_ok is None:  # the first k are leased (built in bulk: a batch may hold 100k rows)
            new_attempts = pa.concat_arrays([pa.repeat(pa.scalar(1, pa.int32()), k), pa.repeat(pa.scalar(0, pa.int32()), f - k)])
            new_expires = pa.concat_arrays([_repeat_ts(expires_us, k), pa.nulls(f - k, TS)])
            leased = fresh.slice(0, k)
        else:
            mask = _leased_prefix(fresh_ok, f, k)
            new_attempts = pa.array([1 if x else 0 for x in mask], pa.int32())
            new_expires = pa.array([expires_us if x else None for x in mask], TS)
            leased = fresh.filter(pa.array(mask, pa.bool_()))
        parts.append(source_rows(Op.INSERT, sub_uid, fresh, new_attempts, new_expires))
        leases.extend(Lease(m, 1, v) for m, v in zip(leased["message_id"].to_pylist(), leased["message_version"].to_pylist()))
        if max_bytes is not None:
            spent += int(pc.sum(pc.fill_null(leased["size_bytes"], 0)).as_py() or 0)
    return Selection(parts, leases, fresh.num_rows, given_up, spent, bytes_ended)
