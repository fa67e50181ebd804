"""The delivery history (issue 17): one row per push attempt, lease, ack, nack, expiry and
dead-lettering, written by the very commit that changes the delivery's state.

Contract. Delta commits are per table, so the history lives in the ``deliveries`` table,
in day partitions ``_attempts-<yyyy-mm-dd>`` (``HISTORY_PREFIX``; no sub_uid starts so).
Its rows are MERGE source rows with ``Op.HISTORY`` (``merge.py``): an insert-only clause,
kept out of the MERGE's join, so a history row never matches, updates or deletes a
delivery, and a write only ever adds files to a history partition. The MERGE stays pinned
to its subscriptions' partitions (its conflict check reads only those), so writers on
different subscriptions adding history to the same day never conflict; the delta-spark
engine's own check skips them by the table's ``insert_only_prefix``.

What each row says is decided on the snapshot the commit is made on, as the state change
is: an outcome whose delivery is no longer current there (acked, leased again, nacked,
expired and re-leased, moved by a seek) is recorded with outcome ``stale`` and what
arrived in its status, never dropped. Because the rows ride in the same commit, a state
change without its history rows, or history rows of a change that did not commit, cannot
exist. Expiry is observed when a lease that ran out is leased again or dead-lettered: it
is recorded then, timed at the old deadline. Deadline extensions are not recorded.

On delta-spark one window remains: its MERGE reads the table again after the snapshot check,
and a commit landing in between can make some decided rows not apply. ``merge.commit``'s
``exact`` check then reruns the decision (the results stay true), but the history rows of the
first MERGE have committed with it: such a race records an outcome that did not apply, and
the rerun records it again (as stale). delta-rs merges exactly its snapshot, so there the
history and the state cannot disagree.

Everything here is pure: building rows reads nothing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Final, Literal, Sequence, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from ..storage import Snapshot
from ..storage.tables import DELIVERIES, HISTORY_PREFIX
from ..timestamps import TS
from .merge import NACKED_MAX_US, SOURCE_SCHEMA
from .model import Op

AttemptOutcome = Literal["push_ok", "push_failed", "lease", "ack", "nack", "expired", "dead_lettered", "stale"]

PUSH_OK: Final = "push_ok"  # the endpoint acked and the ack applied
PUSH_FAILED: Final = "push_failed"  # nack status, timeout, error, or not sent (expired in a worker); the nack applied
LEASE: Final = "lease"  # a delivery began: a pull's or the push job's lease
ACK: Final = "ack"  # a pull ack applied
NACK: Final = "nack"  # a pull nack (modify_ack_deadline 0) applied
EXPIRED: Final = "expired"  # a lease ran out unanswered (seen when the message was leased again or given up)
DEAD_LETTERED: Final = "dead_lettered"  # the attempt limit was reached: marked for its dead-letter move
STALE: Final = "stale"  # an outcome for a delivery no longer current; the status says what arrived

ALL_OUTCOMES: Final[tuple[AttemptOutcome, ...]] = get_args(AttemptOutcome)

MAX_WORKER_CHARS = 256


def default_worker() -> str:
    """host:pid of this process (neither a secret nor read from the environment)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class HistorySettings:
    """Whether the delivery history is written, and the worker name its rows carry."""

    enabled: bool = True
    worker: str = field(default_factory=default_worker)

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise InvalidArgument("history.enabled", f"must be true or false, got {self.enabled!r}")
        if not isinstance(self.worker, str) or not 1 <= len(self.worker) <= MAX_WORKER_CHARS:
            raise InvalidArgument("history.worker", f"must be a string of 1..{MAX_WORKER_CHARS} characters")


RECORD = HistorySettings()
OFF = HistorySettings(enabled=False)


def partition_of(time_us: int) -> str:
    """The history partition of an event at `time_us` (us since the epoch, UTC day)."""
    day = datetime.fromtimestamp(time_us / 1e6, tz=timezone.utc).strftime("%Y-%m-%d")
    return f"{HISTORY_PREFIX}{day}"


def is_history_partition(value: str | None) -> bool:
    return value is not None and value.startswith(HISTORY_PREFIX)


def day_of_partition(value: str) -> str:
    """yyyy-mm-dd of a history partition value."""
    return value[len(HISTORY_PREFIX):]


def _partitions(time_us: np.ndarray) -> pa.Array:
    days = time_us // 86_400_000_000
    uniq, inverse = np.unique(days, return_inverse=True)
    names = [partition_of(int(d) * 86_400_000_000) for d in uniq]
    return pa.DictionaryArray.from_arrays(pa.array(inverse.astype(np.int32)), pa.array(names, pa.string())).cast(pa.string())


def _str(values: str | None | Sequence[str | None] | pa.Array | pa.ChunkedArray, n: int) -> pa.Array | pa.ChunkedArray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.cast(pa.string())
    if values is None or isinstance(values, str):
        return pa.repeat(pa.scalar(values, pa.string()), n) if values is not None else pa.nulls(n, pa.string())
    return pa.array(list(values), pa.string())


def rows(
    settings: HistorySettings,
    subscription: str,
    message_ids: pa.Array | pa.ChunkedArray,
    attempts: pa.Array | pa.ChunkedArray,
    outcome: AttemptOutcome | pa.Array | pa.ChunkedArray,
    time_us: int | pa.Array | pa.ChunkedArray,
    *,
    status: str | None | pa.Array | pa.ChunkedArray = None,
    latency_ms: pa.Array | pa.ChunkedArray | None = None,
) -> pa.Table:
    """HISTORY source rows (``merge.SOURCE_SCHEMA``), one per message id. Empty when the
    history is off or there are no ids. `time_us`: the event's time (one, or one per row);
    each row goes to its day's partition."""
    n = len(message_ids)
    if not settings.enabled or n == 0:
        return SOURCE_SCHEMA.empty_table()
    if isinstance(time_us, int):
        times = np.full(n, time_us, dtype=np.int64)
    else:
        times = np.asarray(time_us.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    if isinstance(outcome, str):
        if outcome not in ALL_OUTCOMES:
            raise ValueError(f"outcome: {outcome!r} is not one of {', '.join(ALL_OUTCOMES)}")
        outcomes: pa.Array | pa.ChunkedArray = pa.repeat(pa.scalar(outcome, pa.string()), n)
    else:
        outcomes = outcome.cast(pa.string())
    return pa.table(
        {
            "op": pa.repeat(pa.scalar(Op.HISTORY.value, pa.string()), n),
            "sub_uid": _partitions(times),
            "message_id": message_ids.cast(pa.string()),
            "message_version": pa.nulls(n, pa.int64()),
            "publish_time": pa.nulls(n, TS),
            "ordering_key": pa.nulls(n, pa.string()),
            "size_bytes": pa.nulls(n, pa.int64()),
            "delivery_attempt": attempts.cast(pa.int32()),
            "lease_expires": pa.nulls(n, TS),
            "dead_letter_key": pa.nulls(n, pa.int64()),
            "attempt_subscription": pa.repeat(pa.scalar(subscription, pa.string()), n),
            "attempt_outcome": outcomes,
            "attempt_status": _str(status, n),
            "attempt_latency_ms": latency_ms.cast(pa.float64()) if latency_ms is not None else pa.nulls(n, pa.float64()),
            "attempt_worker": pa.repeat(pa.scalar(settings.worker, pa.string()), n),
            "attempt_time": pa.array(times, pa.int64()).cast(TS),
        },
        schema=SOURCE_SCHEMA,
    )


def _of(parts: Sequence[pa.Table], op: Op) -> pa.Table:
    got = [p.filter(pc.equal(p["op"], op.value)) for p in parts if p.num_rows]
    got = [g for g in got if g.num_rows]
    return pa.concat_tables(got) if got else SOURCE_SCHEMA.empty_table()


def for_leases(
    settings: HistorySettings, subscription: str, parts: Sequence[pa.Table], available: pa.Table, now_us: int
) -> list[pa.Table]:
    """History of a lease decision's source `parts` (``selection.select``, dead-letter marks
    included): a ``lease`` row per lease granted (LEASE rows, and INSERT rows leased at once),
    a ``dead_lettered`` row per GIVE_UP row, and an ``expired`` row, timed at its old
    deadline, for each of those whose earlier lease had run out (`available`: the
    candidates read, with their lease_expires)."""
    if not settings.enabled:
        return []
    out: list[pa.Table] = []
    leased = _of(parts, Op.LEASE)
    inserted = _of(parts, Op.INSERT)
    fresh = inserted.filter(pc.greater(inserted["delivery_attempt"], 0)) if inserted.num_rows else inserted
    granted = pa.concat_tables([leased, fresh]) if fresh.num_rows else leased
    given = _of(parts, Op.GIVE_UP)
    if granted.num_rows:
        out.append(rows(settings, subscription, granted["message_id"], granted["delivery_attempt"], LEASE, now_us))
    if given.num_rows:
        out.append(rows(settings, subscription, given["message_id"], given["delivery_attempt"], DEAD_LETTERED, now_us))
    if available.num_rows and (leased.num_rows or given.num_rows) and "lease_expires" in available.column_names:
        ended = pa.concat_arrays([c for t in (leased, given) if t.num_rows for c in t["message_id"].chunks])
        lease_us = available["lease_expires"].cast(pa.int64())
        ran_out = pc.and_(
            pc.and_(pc.is_in(available["message_id"], ended), pc.greater(available["delivery_attempt"], 0)),
            pc.greater(lease_us, NACKED_MAX_US),
        )
        old = available.filter(pc.fill_null(ran_out, False))
        if old.num_rows:
            out.append(rows(settings, subscription, old["message_id"], old["delivery_attempt"], EXPIRED,
                            old["lease_expires"].cast(pa.int64())))
    return out


def for_outcomes(
    settings: HistorySettings,
    subscription: str,
    requested: pa.Table,
    applied: pa.Array | pa.ChunkedArray,
    outcome: AttemptOutcome,
    now_us: int,
    *,
    status: str | None = None,
    known: pa.Array | pa.ChunkedArray | None = None,
) -> pa.Table:
    """History of client outcomes (ack or nack) on `requested` (message_id, delivery_attempt;
    one row per message): `outcome` for the ids in `applied` (the ones the commit applies,
    decided on its snapshot), ``stale`` with status `outcome` for the others. `known`: the
    messages with a row in the subscription's partition on that snapshot; an answer naming a
    message without one (acked already, or never delivered: any id a client makes up) is not
    recorded, as Pub/Sub ignores it, so it writes nothing at all (the server's fuzz test)."""
    if not settings.enabled or requested.num_rows == 0:
        return SOURCE_SCHEMA.empty_table()
    if known is not None:
        requested = requested.filter(pc.is_in(requested["message_id"], known))
        if requested.num_rows == 0:
            return SOURCE_SCHEMA.empty_table()
    ok = pc.is_in(requested["message_id"], applied)
    kinds = pc.if_else(ok, pa.scalar(outcome, pa.string()), pa.scalar(STALE, pa.string()))
    stat = pc.if_else(ok, pa.scalar(status, pa.string()), pa.scalar(outcome if status is None else f"{outcome} {status}", pa.string()))
    return rows(settings, subscription, requested["message_id"], requested["delivery_attempt"], kinds, now_us, status=stat)


def push_status(outcomes: pa.Table) -> pa.Array:
    """The status string of push outcomes (``push.sender.OUTCOME_SCHEMA`` rows): ``http 503``,
    ``timeout``, ``expired`` or the error class; the same words the backlog's reasons use."""
    answered = pc.is_in(outcomes["outcome"], pa.array(["ack", "nack"], pa.string()))
    http = pc.binary_join_element_wise(pa.scalar("http"), outcomes["status"].cast(pa.string()), " ")
    described = pc.is_in(outcomes["outcome"], pa.array(["timeout", "expired"], pa.string()))
    error = pc.if_else(pc.equal(pc.fill_null(outcomes["error"], ""), ""), pa.scalar("error"), outcomes["error"])
    got: pa.Array = pc.if_else(answered, http, pc.if_else(described, outcomes["outcome"], error))
    return got


def _delivery_keys(table: pa.Table) -> pa.Array | pa.ChunkedArray:
    """One key per (message_id, delivery_attempt) row: an attempt is all digits, so the last
    separator splits a key unambiguously."""
    attempt = pc.fill_null(table["delivery_attempt"].cast(pa.string()), "")
    got: pa.Array | pa.ChunkedArray = pc.binary_join_element_wise(table["message_id"].cast(pa.string()), attempt, "#")
    return got


def for_push(
    settings: HistorySettings, subscription: str, outcomes: pa.Table, applied: pa.Table, now_us: int
) -> pa.Table:
    """History of push outcomes (OUTCOME_SCHEMA columns: message_id, delivery_attempt,
    outcome, status, error, latency_seconds): ``push_ok`` / ``push_failed`` for the deliveries
    in `applied` (message_id, delivery_attempt: the source rows that apply), ``stale`` (status
    ``push_ok http 200``, ``push_failed http 503``...) for the others. Matched by message AND
    attempt: one commit may hold a late answer for an earlier attempt of a message next to
    the current attempt's (held outcomes pile up over paced commits)."""
    if not settings.enabled or outcomes.num_rows == 0:
        return SOURCE_SCHEMA.empty_table()
    n = outcomes.num_rows
    for name, kind, default in (("outcome", pa.string(), "nack"), ("status", pa.int32(), 0), ("error", pa.string(), ""),
                                ("latency_seconds", pa.float64(), None)):
        if name not in outcomes.column_names:  # outcomes reported without detail
            outcomes = outcomes.append_column(name, pa.repeat(pa.scalar(default, kind), n) if default is not None else pa.nulls(n, kind))
    is_ok = pc.equal(outcomes["outcome"], "ack")
    kind = pc.if_else(is_ok, pa.scalar(PUSH_OK, pa.string()), pa.scalar(PUSH_FAILED, pa.string()))
    status = push_status(outcomes)
    fresh = pc.is_in(_delivery_keys(outcomes), _delivery_keys(applied))
    final = pc.if_else(fresh, kind, pa.scalar(STALE, pa.string()))
    final_status = pc.if_else(fresh, status, pc.binary_join_element_wise(kind, status, " "))
    latency = pc.multiply(outcomes["latency_seconds"].cast(pa.float64()), 1000.0)
    return rows(settings, subscription, outcomes["message_id"], outcomes["delivery_attempt"], final, now_us,
                status=final_status, latency_ms=latency)


# What ``read`` returns: the delivery_attempts view's columns (``spark/sql.py``), but `date`.
READ_COLUMNS = {
    "attempt_subscription": "subscription", "message_id": "message_id", "delivery_attempt": "attempt",
    "attempt_outcome": "outcome", "attempt_status": "status", "attempt_latency_ms": "latency_ms",
    "attempt_worker": "worker", "attempt_time": "time",
}


def partitions(snap: Snapshot) -> list[str]:
    """The history's day partitions in a deliveries snapshot (from the log; no read), oldest first."""
    stats = snap.file_stats()
    column = f"partition.{DELIVERIES.partition_column}"
    if stats.num_rows == 0 or column not in stats.column_names:
        return []
    return sorted({u for u in stats[column].to_pylist() if is_history_partition(u)})


def read(snap: Snapshot, subscription: str | None = None) -> pa.Table:
    """The history rows of a deliveries snapshot, with the delivery_attempts view's column
    names (subscription, message_id, attempt, outcome, status, latency_ms, worker, time),
    ordered by time; only `subscription`'s when given. Reads only the history partitions."""
    flt = pc.field("attempt_subscription").cast(pa.string()) == subscription if subscription is not None else None
    got = [snap.read(list(READ_COLUMNS), partition=p, filter=flt) for p in partitions(snap)]
    if not got:
        return pa.schema([pa.field(v, DELIVERIES.schema.field(k).type) for k, v in READ_COLUMNS.items()]).empty_table()
    table = pa.concat_tables(got, promote_options="permissive")
    table = pa.table({v: table[k].cast(DELIVERIES.schema.field(k).type) for k, v in READ_COLUMNS.items()})
    return table.sort_by([("time", "ascending"), ("message_id", "ascending")])
