"""Outcomes of deliveries (ack, nack, deadline change, expiry, give-up) as MERGE source rows.

Contract: an outcome names one delivery, (message_id, delivery_attempt) and the row version
its ack id carries (``ackid``; None: any), and applies only while that delivery is still
the current one (same attempt, same version): an ack id from an earlier delivery never acks
or extends a later one, even of a row a seek brought back. A nack ends the lease at the retry delay
(the NACKED sentinel by default); a deadline change never applies to a nacked row, nor
to a row never delivered. Nothing applies to a delivery the ordering cascade ended
(``merge.CASCADED_US``): its message comes again after its key's earlier one. Several
ack ids for one message keep the latest delivery's.

``rows`` builds the source without reading anything (the push job and the counting
client calls use it). ``decide`` is the PURE per-id decision: given the current rows of
the requested messages in a snapshot, it returns the result of each requested id and
exactly the source rows that will apply, so committing it on that snapshot does what
the results say.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..storage import Snapshot
from ..storage.engine import read_by_ids
from ..policy.ordering import followers
from ..policy.round_outcomes import newer
from ..timestamps import TS, ts_scalar
from .hooks import DeliveryHooks
from .merge import CASCADED_US, NACKED_US, cascade_rows, source_rows
from .model import Delivery, DeliveryRef, IdResult, Op, OutcomeKind, Result

_OP = {
    OutcomeKind.ACK: Op.ACK,
    OutcomeKind.NACK: Op.NACK,
    OutcomeKind.EXPIRY: Op.NACK,  # a lease that ran out unanswered is retried as a nack
    OutcomeKind.DEADLINE: Op.DEADLINE,
    OutcomeKind.GIVE_UP: Op.GIVE_UP,
}
# The smallest lease_expires a deadline change still applies to (NACKED_SQL is 1 us: rows
# at or below it are nacked).
_NACKED_MAX_US = 1

CURRENT_COLUMNS = ["message_id", "delivery_attempt", "lease_expires", "message_version", "dead_letter_key"]


def op_of(kind: OutcomeKind) -> Op:
    return _OP[kind]


def _ref(item: DeliveryRef | Delivery) -> tuple[str, int, int | None]:
    return (item[0], item[1], item[2] if len(item) > 2 else None)


def latest_per_message(items: Iterable[DeliveryRef | Delivery]) -> pa.Table:
    """(message_id, delivery_attempt, message_version) with one row per message: its latest
    requested delivery (``newer``; the version null when the id named none)."""
    latest: dict[str, tuple[int, int | None]] = {}
    for item in items:
        message_id, attempt, version = _ref(item)
        prev = latest.get(message_id)
        if prev is None or newer((attempt, version), prev):
            latest[message_id] = (attempt, version)
    return pa.table({
        "message_id": pa.array(list(latest), pa.string()),
        "delivery_attempt": pa.array([a for a, _ in latest.values()], pa.int32()),
        "message_version": pa.array([v for _, v in latest.values()], pa.int64()),
    })


def rows(
    sub_uid: str, kind: OutcomeKind, deliveries: pa.Table, lease_expires_us: int | pa.Array | pa.ChunkedArray | None = None
) -> pa.Table:
    """Source rows applying `kind` to `deliveries` (message_id, delivery_attempt).

    `lease_expires_us`: the new deadline for DEADLINE, the retry time for NACK and EXPIRY
    (default the NACKED sentinel); ignored for ACK and GIVE_UP. Pure."""
    n = deliveries.num_rows
    op = op_of(kind)
    if op in (Op.ACK, Op.GIVE_UP):
        lease: pa.Array | pa.ChunkedArray = pa.nulls(n, TS)
    elif isinstance(lease_expires_us, (pa.Array, pa.ChunkedArray)):
        lease = lease_expires_us.cast(TS)
    else:
        if lease_expires_us is None and op is Op.DEADLINE:
            raise ValueError("lease_expires_us: a deadline change needs the new deadline")
        lease = pa.repeat(pa.scalar(NACKED_US if lease_expires_us is None else lease_expires_us, TS), n)
    return source_rows(op, sub_uid, deliveries, deliveries["delivery_attempt"], lease)


def nack_lease(policy: DeliveryHooks, nacked: pa.Table, now: float) -> pa.Array | None:
    """The lease_expires (us) the nacks of `nacked` (message_id, delivery_attempt) get
    under `policy`: one value per row from its retry-delay hook, or None for the NACKED
    sentinel (the default: available again at once). The one place the hook is applied;
    pull's nacks and the push job's failed pushes both come here. Pure."""
    if policy.retry_delay is None:
        return None
    return policy.retry_delay(nacked, now)


FOLLOWER_COLUMNS = ["message_id", "message_version", "ordering_key", "delivery_attempt"]


def read_followers(snap: Snapshot, sub_uid: str, now: float, nacked_ids: Sequence[str]) -> pa.Table:
    """For the ordering nack cascade (``policy.ordering.followers``): the rows with an
    ordering key that are outstanding at `now` (lease running) or are the nacked messages
    themselves (FOLLOWER_COLUMNS), never a row a dead-letter move owns (the CASCADE clause
    refuses those). Its cost follows the outstanding messages, not the backlog."""
    ids = pa.array(sorted(set(nacked_ids)), pa.string())
    lease = pc.field("lease_expires")
    return snap.read(
        FOLLOWER_COLUMNS, partition=sub_uid,
        filter=lease.is_valid() & (pc.field("ordering_key").cast(pa.string()) != "") & pc.field("dead_letter_key").is_null()
        & ((lease > ts_scalar(now)) | pc.field("message_id").cast(pa.string()).isin(ids)),
    )


def cascade(sub_uid: str, nacked: pa.Table, snap: Snapshot, now: float) -> pa.Table:
    """CASCADE source rows ending the leases of the later outstanding messages of the nacked
    messages' keys (`nacked`: message_id, delivery_attempt of the nacks that apply), so
    they come again after them, in order. They get ``CASCADED_US``: due at once, yet held
    back behind their key's nacked head while it waits out any retry delay, and their ack
    ids no longer apply (an ack of one would take it out of its key's order)."""
    if nacked.num_rows == 0:
        return cascade_rows(sub_uid, nacked.slice(0, 0))
    return cascade_rows(sub_uid, followers(nacked, read_followers(snap, sub_uid, now, nacked["message_id"].to_pylist())))


class Decision(NamedTuple):
    results: list[IdResult]  # one per requested id, in request order
    source: pa.Table  # the source rows that apply (SOURCE_SCHEMA); empty when none does


def _applies(
    kind: OutcomeKind, attempt: int, version: int | None, current: tuple[int, int | None, int | None, bool] | None
) -> bool:
    if current is None:
        return False
    now_attempt, lease_us, now_version, marked = current
    if marked:  # a dead-letter move owns the row: every outcome clause refuses it (merge._UNMARKED)
        return False
    if now_attempt != attempt or (version is not None and version != now_version):
        return False
    op = op_of(kind)
    if op in (Op.NACK, Op.DEADLINE) and now_attempt <= 0:
        return False
    if op in (Op.ACK, Op.NACK) and lease_us == CASCADED_US:  # the ordering cascade ended it (merge's clauses)
        return False
    if op is Op.DEADLINE and (lease_us is None or lease_us <= _NACKED_MAX_US):
        return False
    return True


def decide(
    sub_uid: str,
    kind: OutcomeKind,
    requested: Sequence[Delivery | DeliveryRef],
    current: pa.Table,
    lease_expires_us: int | pa.Array | None = None,
) -> Decision:
    """Results per requested id, and the source rows that apply, for `kind` on `requested`.

    `current`: the rows (CURRENT_COLUMNS) of the requested messages in the snapshot the
    source will be merged into; a message without a row is unknown or acked. An id whose
    message is also requested with a later attempt is superseded. `lease_expires_us` as
    for ``rows``; an array is one value per message of ``latest_per_message(requested)``. Pure."""
    lease = current["lease_expires"].cast(pa.int64()).to_pylist()
    versions = current["message_version"].to_pylist() if "message_version" in current.column_names else [None] * current.num_rows
    marks = (
        [m is not None for m in current["dead_letter_key"].to_pylist()] if "dead_letter_key" in current.column_names
        else [False] * current.num_rows
    )
    now_rows = dict(zip(current["message_id"].to_pylist(), zip(current["delivery_attempt"].to_pylist(), lease, versions, marks)))
    latest = latest_per_message(requested)
    keep = {m: (a, v) for m, a, v in zip(latest["message_id"].to_pylist(), latest["delivery_attempt"].to_pylist(),
                                          latest["message_version"].to_pylist())}
    ok = {m for m, (a, v) in keep.items() if _applies(kind, a, v, now_rows.get(m))}
    refs = [_ref(r) for r in requested]
    results = [
        IdResult(m, a, Result.SUCCESS if m in ok and keep[m] == (a, v) else Result.INVALID_ACK_ID) for m, a, v in refs
    ]
    mask = pc.is_in(latest["message_id"], pa.array(sorted(ok), pa.string())).combine_chunks()
    if isinstance(lease_expires_us, pa.Array):
        lease_expires_us = lease_expires_us.filter(mask)
    return Decision(results, rows(sub_uid, kind, latest.filter(mask), lease_expires_us))


def read_current(snap: Snapshot, sub_uid: str, message_ids: Sequence[str]) -> pa.Table:
    """The current rows (CURRENT_COLUMNS) of the given messages in `snap`; opens only the
    files whose message_id range overlaps the wanted ids."""
    ids = pc.unique(pa.array(list(message_ids), pa.string()))
    if len(ids) == 0:
        return pa.table({"message_id": pa.array([], pa.string()), "delivery_attempt": pa.array([], pa.int32()),
                         "lease_expires": pa.array([], TS)})
    return read_by_ids(snap, ids, CURRENT_COLUMNS, partition=sub_uid)
