"""Lease state of pull delivery: fan-out, lease, ack, deadline changes.

Every operation is one MERGE into the subscription's own ``deliveries`` partition,
pinned by a literal ``sub_uid``. Two writers on one subscription therefore conflict
in Delta and one reruns from a fresh snapshot: a message can never be leased to two
pullers at once, and an ack is never lost. The fan-out cursor (the last messages-table
version copied into the partition) is a Delta application transaction committed in
the same MERGE, so cursor and rows move together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .registry import SubscriptionRecord
from .storage import Engine, MatchedDelete, MatchedUpdate, NotMatchedInsert, Snapshot, literal
from .storage.tables import DELIVERIES, MESSAGES, TS

# At most this many messages-table versions are fanned out in one pull.
MAX_FANOUT_VERSIONS = 500
# Advance a cursor with nothing to insert only once it lags this far (saves a commit per poll).
IDLE_CURSOR_LAG = 50

_STATE_COLUMNS = ["message_id", "message_version", "publish_time", "delivery_attempt", "lease_expires"]
_FANOUT_COLUMNS = ["message_id", "publish_time", "ordering_key", "size_bytes"]


# lease_expires of a nacked delivery: long past, so it is available at once and it can
# be told apart from a lease that merely ran out.
NACKED_US = 0
NACKED_SQL = "CAST('1970-01-01T00:00:00.000001Z' AS TIMESTAMP)"


def cursor_app_id(sub_uid: str) -> str:
    return f"deltabus-fanout-{sub_uid}"


def _us(ts: float) -> int:
    return int(round(ts * 1_000_000))


# Every write to a subscription's partition is one MERGE of source rows tagged with an op.
OPS_MERGE = [
    MatchedDelete(when="s.op = 'ack' AND t.delivery_attempt = s.delivery_attempt"),
    MatchedUpdate({"lease_expires": "s.lease_expires"}, when="s.op = 'nack' AND t.delivery_attempt = s.delivery_attempt"),
    MatchedUpdate({"delivery_attempt": "s.delivery_attempt", "lease_expires": "s.lease_expires"}, when="s.op = 'lease'"),
    NotMatchedInsert({c: f"s.{c}" for c in DELIVERIES.schema.names}, when="s.op = 'insert'"),
]
SOURCE_SCHEMA = pa.schema([pa.field("op", pa.string()), *DELIVERIES.schema])


def source_rows(op: str, sub_uid: str, table: pa.Table, attempt: pa.Array, lease: pa.Array) -> pa.Table:
    """MERGE source rows for `op` from a table with message_id and any deliveries columns."""
    n = table.num_rows

    def col(name: str, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return table[name] if name in table.column_names else pa.nulls(n, kind)

    return pa.table(
        {
            "op": pa.array([op] * n, pa.string()),
            "sub_uid": pa.array([sub_uid] * n, pa.string()),
            "message_id": table["message_id"],
            "message_version": col("message_version", pa.int64()),
            "publish_time": col("publish_time", TS),
            "ordering_key": col("ordering_key", pa.string()),
            "size_bytes": col("size_bytes", pa.int64()),
            "delivery_attempt": attempt,
            "lease_expires": lease,
        },
        schema=SOURCE_SCHEMA,
    )


@dataclass(frozen=True, slots=True)
class Lease:
    message_id: str
    delivery_attempt: int
    message_version: int


def _on(sub_uid: str) -> str:
    return f"t.sub_uid = {literal(sub_uid)} AND t.message_id = s.message_id"


def available_filter(now: float) -> pc.Expression:
    return pc.field("lease_expires").is_null() | (pc.field("lease_expires") <= pa.scalar(_us(now), TS))


AVAILABLE_ORDER = [("message_version", "ascending"), ("message_id", "ascending")]


def leased_files(now: float) -> Callable[[pa.Table], pa.Array]:
    """For ``Snapshot.read_first``: files whose every row holds a lease running past `now`
    (no null lease, smallest lease in the future) have nothing available to lease."""

    def skip(actions: pa.Table) -> pa.Array:
        if "min.lease_expires" not in actions.column_names or "null_count.lease_expires" not in actions.column_names:
            return pa.array([False] * actions.num_rows)
        lows = actions["min.lease_expires"]
        at = pa.scalar(_us(now), TS).cast(lows.type)
        return pc.and_(pc.equal(actions["null_count.lease_expires"], 0), pc.greater(lows, at))

    return skip


def read_available(snap: Snapshot, sub_uid: str, now: float, limit: int) -> pa.Table:
    """The first `limit` deliveries available at `now` (never leased, nacked, or past their
    deadline), oldest messages first; reads only the files that can hold them."""
    return snap.read_first(
        limit, AVAILABLE_ORDER, _STATE_COLUMNS, partition=sub_uid, filter=available_filter(now), skip_files=leased_files(now)
    )


def pending_range(engine: Engine, snap: Snapshot, sub: SubscriptionRecord) -> tuple[int, int]:
    """(cursor, latest): messages versions cursor+1..latest are not yet fanned out."""
    cursor = snap.txn_version(cursor_app_id(sub.sub_uid))
    if cursor is None:
        cursor = sub.start_version
    return cursor, engine.version(MESSAGES.name)


def read_unfanned(engine: Engine, sub: SubscriptionRecord, first: int, last: int) -> pa.Table:
    if last < first:
        return pa.table({c: pa.array([], MESSAGES.schema.field(c).type) for c in _FANOUT_COLUMNS} | {"_commit_version": pa.array([], pa.int64())})
    return engine.snapshot(MESSAGES.name).changes(first, last, _FANOUT_COLUMNS, partition=sub.topic_uid)


def pull(
    engine: Engine, sub: SubscriptionRecord, *, max_messages: int, lease_seconds: float, clock: Callable[[], float]
) -> list[Lease]:
    """Lease up to max_messages available messages for lease_seconds; return the leases.

    The time is read inside each attempt: a rerun after a conflict leases from its own
    "now", so a lease is never granted already shortened or expired.
    """

    def fn(snap: Snapshot) -> list[Lease]:
        now = clock()
        expires = pa.scalar(_us(now + lease_seconds), TS)
        cursor, latest = pending_range(engine, snap, sub)
        end = min(latest, cursor + MAX_FANOUT_VERSIONS)
        fresh = read_unfanned(engine, sub, cursor + 1, end)

        available = read_available(snap, sub.sub_uid, now, max_messages)
        room = max_messages - available.num_rows

        if fresh.num_rows:
            order = pc.sort_indices(fresh, [("_commit_version", "ascending"), ("message_id", "ascending")])
            fresh = fresh.take(order)
        n_fresh_leased = min(room, fresh.num_rows)

        if available.num_rows == 0 and fresh.num_rows == 0:
            if end - cursor >= IDLE_CURSOR_LAG:  # nothing for this topic in a long range: move past it
                snap.commit_txns([(cursor_app_id(sub.sub_uid), end)])
            return []

        leased_attempts = pc.add(available["delivery_attempt"], pa.scalar(1, pa.int32())).combine_chunks()
        parts = []
        if available.num_rows:
            parts.append(source_rows("lease", sub.sub_uid, available, leased_attempts, pa.array([expires.value] * available.num_rows, TS)))
        if fresh.num_rows:
            parts.append(
                source_rows(
                    "insert",
                    sub.sub_uid,
                    fresh.rename_columns(["message_version" if c == "_commit_version" else c for c in fresh.column_names]),
                    pa.array([1] * n_fresh_leased + [0] * (fresh.num_rows - n_fresh_leased), pa.int32()),
                    pa.concat_arrays([pa.array([expires.value] * n_fresh_leased, TS), pa.nulls(fresh.num_rows - n_fresh_leased, TS)]),
                )
            )
        snap.merge(
            pa.concat_tables(parts),
            _on(sub.sub_uid),
            OPS_MERGE,
            app_txn=(cursor_app_id(sub.sub_uid), end) if end > cursor else None,
        )
        out = [
            Lease(m, a, v)
            for m, a, v in zip(
                available["message_id"].to_pylist(),
                leased_attempts.to_pylist() if available.num_rows else [],
                available["message_version"].to_pylist(),
            )
        ]
        out.extend(
            Lease(m, 1, v)
            for m, v in zip(
                fresh["message_id"].to_pylist()[:n_fresh_leased], fresh["_commit_version"].to_pylist()[:n_fresh_leased]
            )
        )
        return out

    return engine.transact(DELIVERIES.name, fn, what=f"pull {sub.name}")


def _keyed(items: Iterable[tuple[str, int]]) -> pa.Table:
    # One source row per message: several ack ids for one message keep the latest delivery's.
    latest: dict[str, int] = {}
    for message_id, attempt in items:
        if attempt > latest.get(message_id, -1):
            latest[message_id] = attempt
    return pa.table(
        {"message_id": pa.array(list(latest), pa.string()), "delivery_attempt": pa.array(list(latest.values()), pa.int32())}
    )


def acknowledge(engine: Engine, sub: SubscriptionRecord, items: Sequence[tuple[str, int]]) -> int:
    """Ack (message_id, delivery_attempt) pairs; return how many messages this acked.

    Unknown, already-acked or superseded deliveries are ignored.
    """
    if not items:
        return 0
    source = _keyed(items)

    def fn(snap: Snapshot) -> int:
        m = snap.merge(source, _on(sub.sub_uid), [MatchedDelete(when="t.delivery_attempt = s.delivery_attempt")])
        return int(m.get("num_target_rows_deleted", 0))

    return engine.transact(DELIVERIES.name, fn, what=f"acknowledge {sub.name}")


def modify_deadline(
    engine: Engine, sub: SubscriptionRecord, items: Sequence[tuple[str, int]], seconds: float, *, clock: Callable[[], float]
) -> int:
    """Set the lease of the given deliveries to end `seconds` from now; 0 is a nack.

    A nack marks the row with the NACKED sentinel, and an extension never applies to a
    nacked row: a lease extension racing a nack cannot hold the message back. An
    extension that arrives just after its lease ran out still applies while nobody
    else has been given the message (the delivery attempt still matches).
    """
    if not items:
        return 0
    keyed = _keyed(items)
    when = "t.delivery_attempt = s.delivery_attempt AND t.delivery_attempt > 0"
    if seconds > 0:
        when += f" AND t.lease_expires > {NACKED_SQL}"

    def fn(snap: Snapshot) -> int:
        expires = NACKED_US if seconds <= 0 else _us(clock() + seconds)
        source = keyed.append_column("lease_expires", pa.array([expires] * keyed.num_rows, TS))
        m = snap.merge(source, _on(sub.sub_uid), [MatchedUpdate({"lease_expires": "s.lease_expires"}, when=when)])
        return int(m.get("num_target_rows_updated", 0))

    return engine.transact(DELIVERIES.name, fn, what=f"modify_ack_deadline {sub.name}")


from .delivery.payloads import fetch_messages, read_payloads  # noqa: E402,F401  (moved; callers switch to delivery)
