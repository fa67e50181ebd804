"""One micro-batch's write to the deliveries table: fan-out, leases and outcomes in one MERGE."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..leasing import (
    MAX_FANOUT_VERSIONS,
    NACKED_US,
    OPS_MERGE,
    _us,
    cursor_app_id,
    read_available,
    read_unfanned,
    source_rows,
)
from ..registry import SubscriptionRecord
from ..storage import Engine, Snapshot, literal
from ..storage.tables import TS

@dataclass(frozen=True, slots=True)
class SubPlan:
    """What the job may do for one push subscription in this batch."""

    sub: SubscriptionRecord
    room: int  # leases allowed now (window room, 0 while in backoff)
    exclude: frozenset[str] = frozenset()  # message ids in flight or with an outcome now


@dataclass(slots=True)
class PlanResult:
    leases: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # sub_uid -> (message_id, attempt)
    fanned_out: int = 0
    committed: bool = False
    leased_at: float = 0.0  # the `now` the leases' deadlines count from


def fresh_rows(
    engine: Engine, sub: SubscriptionRecord, cursor: int, batch: pa.Table, first: int, last: int
) -> tuple[pa.Table, int]:
    """Messages of sub's topic after its cursor, up to version `last`; and the new cursor.

    In the steady state the cursor is the batch's start and the rows come from the
    stream's micro-batch; a subscription that lags (new, or switched from pull) catches
    up from the change feed first.
    """
    if cursor >= last:
        return batch.slice(0, 0).select(["message_id", "publish_time", "ordering_key", "size_bytes", "version"]), cursor
    if cursor < first:
        end = min(last, cursor + MAX_FANOUT_VERSIONS)
        rows = read_unfanned(engine, sub, cursor + 1, end).rename_columns(
            ["message_id", "publish_time", "ordering_key", "size_bytes", "version"]
        )
        return rows, end
    mask = pc.and_(pc.equal(batch["topic_uid"], sub.topic_uid), pc.greater(batch["version"], cursor))
    rows = batch.filter(mask).select(["message_id", "publish_time", "ordering_key", "size_bytes", "version"])
    return rows, last


def execute(
    engine: Engine,
    snap: Snapshot,
    plans: Sequence[SubPlan],
    outcomes: Mapping[str, tuple[pa.Table, pa.Table]],
    batch: pa.Table,
    first: int,
    last: int,
    *,
    now: float,
    batch_txn: tuple[str, int] | None,
) -> PlanResult:
    """Build and commit the batch's single MERGE. `outcomes`: sub_uid -> (acks, nacks) tables
    of (message_id, delivery_attempt). Called inside ``engine.transact``: a conflict reruns it."""
    parts: list[pa.Table] = []
    txns: list[tuple[str, int]] = []
    result = PlanResult(leased_at=now)
    for plan in plans:
        sub = plan.sub
        uid = sub.sub_uid
        cursor = snap.txn_version(cursor_app_id(uid))
        if cursor is None:
            cursor = sub.start_version
        fresh, new_cursor = fresh_rows(engine, sub, cursor, batch, first, last)
        if new_cursor > cursor:
            txns.append((cursor_app_id(uid), new_cursor))
        room = plan.room
        chosen: list[tuple[str, int]] = []
        if room > 0:
            # In-flight ids are leased, so rarely available; read enough to cover them anyway.
            avail = read_available(snap, uid, now, room + len(plan.exclude))
            if plan.exclude and avail.num_rows:
                avail = avail.filter(pc.invert(pc.is_in(avail["message_id"], pa.array(list(plan.exclude), pa.string()))))
            avail = avail.slice(0, room)
            if avail.num_rows:
                attempts = pc.add(avail["delivery_attempt"], pa.scalar(1, pa.int32())).combine_chunks()
                expires = pa.array([_us(now + sub.ack_deadline_seconds)] * avail.num_rows, TS)
                parts.append(source_rows("lease", uid, avail, attempts, expires))
                chosen.extend(zip(avail["message_id"].to_pylist(), attempts.to_pylist()))
            room -= avail.num_rows
        if fresh.num_rows:
            order = pc.sort_indices(fresh, [("version", "ascending"), ("message_id", "ascending")])
            fresh = fresh.take(order).rename_columns(["message_id", "publish_time", "ordering_key", "size_bytes", "message_version"])
            k = max(0, min(room, fresh.num_rows))
            attempts = pa.array([1] * k + [0] * (fresh.num_rows - k), pa.int32())
            expires = pa.concat_arrays(
                [pa.array([_us(now + sub.ack_deadline_seconds)] * k, TS), pa.nulls(fresh.num_rows - k, TS)]
            )
            parts.append(source_rows("insert", uid, fresh, attempts, expires))
            chosen.extend((m, 1) for m in fresh["message_id"].to_pylist()[:k])
            result.fanned_out += fresh.num_rows
        if chosen:
            result.leases[uid] = chosen
    for uid, (acks, nacks) in outcomes.items():
        if acks.num_rows:
            parts.append(source_rows("ack", uid, acks, acks["delivery_attempt"], pa.nulls(acks.num_rows, TS)))
        if nacks.num_rows:
            parts.append(source_rows("nack", uid, nacks, nacks["delivery_attempt"], pa.array([NACKED_US] * nacks.num_rows, TS)))
    if not parts and not txns:
        return result
    if batch_txn is not None:
        txns.append(batch_txn)
    if not parts:
        snap.commit_txns(txns)
        result.committed = True
        return result
    source = pa.concat_tables(parts)
    uids = sorted({p.sub.sub_uid for p in plans} | set(outcomes))
    in_list = ", ".join(literal(u) for u in uids)
    snap.merge(source, f"t.sub_uid IN ({in_list}) AND t.sub_uid = s.sub_uid AND t.message_id = s.message_id", OPS_MERGE, app_txn=txns)
    result.committed = True
    return result
