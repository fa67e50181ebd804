"""Committing the core's decisions: the OPS MERGE into the deliveries table.

Contract: every write to a subscription's deliveries partition is ONE commit of source
rows tagged with an ``Op`` (``SOURCE_SCHEMA``): a MERGE joined on message_id and pinned by a
literal ``sub_uid`` (so work on other subscriptions never conflicts, and two writers on
one subscription conflict in Delta and one reruns from a fresh snapshot), or, when every
row inserts a newly fanned-out message, a blind append with the cursor's transaction (the
same effect: ``_append_new``). The fan-out cursors and any other application transactions
commit in the same commit. Deciding is
not done here: the source rows come from the pure functions of ``selection`` and
``outcomes``; ``commit`` only writes them.

Nacked rows. ``lease_expires`` at or below ``NACKED_SQL`` (1 us after the epoch) marks a
nacked delivery; the DEADLINE clause applies only above it, so a deadline extension racing
a nack can never lease the nacked message again. A nack under a retry policy (issue 13)
keeps that rule exactly: it stores the NEGATED time the message is due again
(``delayed_nack_us``), which is still below the mark, so the same clause refuses it, and
selection reads the due time back (``delivery/retry_delay.py``). The plain NACKED sentinel
(0) is the special case "due at the epoch", that is at once. Chosen over a due time in the
future (which the DEADLINE clause could not tell from a live lease) and over a new column
(a schema version of the deliveries table, and a migration, for one bit). Readers of
leases need no change: the ``deliveries`` SQL view calls anything before 1970-01-02
nacked, and the backlog counts a row outstanding only while its lease_expires is after
now, so a delayed nack shows as nacked, never as outstanding.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..storage import MatchedDelete, MatchedUpdate, NotMatchedInsert, Snapshot, literal
from ..storage.engine import Clause, WriteRaced, read_by_ids
from ..storage.tables import DELIVERIES, HISTORY_PREFIX
from ..timestamps import TS
from .model import Op

# lease_expires of a nacked delivery: long past, so it is available at once and it can
# be told apart from a lease that merely ran out.
NACKED_US = 0
NACKED_SQL = "CAST('1970-01-01T00:00:00.000001Z' AS TIMESTAMP)"
# The largest lease_expires (us) that still marks a nacked row (NACKED_SQL).
NACKED_MAX_US = 1
# lease_expires of a delivery ended by the ordering cascade (``Op.CASCADE``): the nacked mark
# itself, 1 us, which no nack stores (the sentinel is 0, a delayed nack is negative). So
# the row is nacked and due at once for every reader, and the ACK and NACK clauses can tell
# that its ack id is stale: an earlier message of its key came back, so it must come again
# after it and an ack of the ended delivery may not take it out of that order.
CASCADED_US = NACKED_MAX_US
CASCADED_SQL = NACKED_SQL
# lease_expires of a row a seek kept (issue 15): the same mark, for the same reasons. The
# message is due at once, and an ack, nack or extension of a delivery made before the seek
# no longer applies to it (so an in-flight push or pull answered after the seek cannot take
# a replayed message out of the replay).
SEEK_STALE_US = CASCADED_US


def delayed_nack_us(due_us: pa.Array) -> pa.Array:
    """lease_expires (int64 us) of nacks due again at `due_us` (us since the epoch, > 0):
    the negated due time, at or below the nacked mark (see the module docstring)."""
    return pc.negate(due_us.cast(pa.int64()))

# The delivery an outcome names: its attempt and, when the ack id carries it, the row version
# it was made from (a row a seek brought back restarts its attempts: ``ackid``).
_MATCHES = "t.delivery_attempt = s.delivery_attempt AND (s.message_version IS NULL OR t.message_version = s.message_version)"
# A row marked for a dead-letter move belongs to that move until it drops the row
# (storage/keyed_steps): no outcome or lease may change it meanwhile.
_UNMARKED = "t.dead_letter_key IS NULL"
# A delivery the ordering cascade ended takes no ack or nack of that delivery (CASCADED_US).
# Only subscriptions with message ordering ever hold such a row; for the others the
# comparison is always true (a leased row's lease_expires is never null).
_NOT_CASCADED = f"t.lease_expires <> {CASCADED_SQL}"

# One clause per op, in evaluation order (the first matching clause applies).
OPS_CLAUSES: Mapping[Op, Clause] = {
    Op.ACK: MatchedDelete(when=f"s.op = '{Op.ACK.value}' AND {_MATCHES} AND {_UNMARKED} AND {_NOT_CASCADED}"),
    # Dead-lettering (issue 13): the decision marks the row with its move's key (the source
    # row carries it, ``delivery/dead_letter``); the move copies it to the dead-letter topic
    # and then deletes it. Only on the attempt it was decided on, and never twice.
    Op.GIVE_UP: MatchedUpdate(
        {"dead_letter_key": "s.dead_letter_key"},
        when=f"s.op = '{Op.GIVE_UP.value}' AND {_MATCHES} AND {_UNMARKED} AND s.dead_letter_key IS NOT NULL",
    ),
    Op.NACK: MatchedUpdate(
        {"lease_expires": "s.lease_expires"},
        when=f"s.op = '{Op.NACK.value}' AND {_MATCHES} AND t.delivery_attempt > 0 AND {_UNMARKED} AND {_NOT_CASCADED}",
    ),
    # Ordering keys: an earlier message of the key came back (nacked, or its lease ran out),
    # so this later delivery ends too and the message comes again after it. Only a delivery
    # still leased (above the nacked mark) is ended, on the attempt it was decided on.
    Op.CASCADE: MatchedUpdate(
        {"lease_expires": "s.lease_expires"},
        when=f"s.op = '{Op.CASCADE.value}' AND {_MATCHES} AND t.delivery_attempt > 0 AND t.lease_expires > {NACKED_SQL}"
        f" AND {_UNMARKED}",
    ),
    # An extension never applies to a nacked row: racing a nack, it cannot hold the message back.
    Op.DEADLINE: MatchedUpdate(
        {"lease_expires": "s.lease_expires"},
        when=f"s.op = '{Op.DEADLINE.value}' AND {_MATCHES} AND t.delivery_attempt > 0 AND t.lease_expires > {NACKED_SQL}"
        f" AND {_UNMARKED}",
    ),
    # A lease is granted only on the attempt it was decided on: every lease adds one to
    # delivery_attempt, so of two writers that decided on the same row only the first can
    # match (compare-and-set). delta-rs's conflict check already reruns the second; on
    # delta-spark a commit landing between the snapshot check and the MERGE's own read is
    # seen by neither check, and without this the second lease overwrote the first.
    Op.LEASE: MatchedUpdate(
        {"delivery_attempt": "s.delivery_attempt", "lease_expires": "s.lease_expires"},
        when=f"s.op = '{Op.LEASE.value}' AND t.delivery_attempt = s.delivery_attempt - 1 AND {_UNMARKED}",
    ),
    # Seek (issue 15): every unmarked row of the partition is either dropped (it counts as
    # acked) or kept and made due at once with the stale mark (``SEEK_STALE_US``), whatever
    # delivery holds it: a seek replaces the unacked set, it answers no delivery.
    Op.SEEK_DROP: MatchedDelete(when=f"s.op = '{Op.SEEK_DROP.value}' AND {_UNMARKED}"),
    Op.SEEK_KEEP: MatchedUpdate(
        {"message_version": "s.message_version", "lease_expires": "s.lease_expires"},
        when=f"s.op = '{Op.SEEK_KEEP.value}' AND {_UNMARKED}",
    ),
    Op.INSERT: NotMatchedInsert({c: f"s.{c}" for c in DELIVERIES.schema.names}, when=f"s.op = '{Op.INSERT.value}'"),
    # The delivery history (issue 17, ``delivery/history``): insert only. Its rows are kept out
    # of the join (``pinned_on``), so they never match a delivery, and their sub_uid is an
    # ``_attempts-<day>`` partition the MERGE's condition does not read.
    Op.HISTORY: NotMatchedInsert({c: f"s.{c}" for c in DELIVERIES.schema.names}, when=f"s.op = '{Op.HISTORY.value}'"),
}
OPS_MERGE: list[Clause] = list(OPS_CLAUSES.values())
SOURCE_SCHEMA = pa.schema([pa.field("op", pa.string()), *DELIVERIES.schema])
# The columns only history rows fill (the deliveries table's version 3).
HISTORY_COLUMNS = DELIVERIES.layers[2]


def clauses_for(ops: Sequence[Op]) -> list[Clause]:
    """The clauses of the ops present, in OPS_MERGE order: a clause no source row can
    match is left out, so an ack-only MERGE is no heavier than a plain delete-merge."""
    present = set(ops)
    return [c for op, c in OPS_CLAUSES.items() if op in present]


def source_rows(
    op: Op,
    sub_uid: str,
    table: pa.Table,
    attempt: pa.Array | pa.ChunkedArray,
    lease: pa.Array | pa.ChunkedArray,
    mark: int | None = None,
) -> pa.Table:
    """MERGE source rows for `op` from a table with message_id and any deliveries columns
    (the others are null), with the given delivery attempts and lease_expires. `mark`: the
    dead-letter move's key every row carries (GIVE_UP rows; ``dead_letter.with_key``)."""
    n = table.num_rows

    def col(name: str, kind: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return table[name] if name in table.column_names else pa.nulls(n, kind)

    return pa.table(
        {
            "op": pa.repeat(pa.scalar(op.value, pa.string()), n),
            "sub_uid": pa.repeat(pa.scalar(sub_uid, pa.string()), n),
            "message_id": table["message_id"],
            "message_version": col("message_version", pa.int64()),
            "publish_time": col("publish_time", TS),
            "ordering_key": col("ordering_key", pa.string()),
            "size_bytes": col("size_bytes", pa.int64()),
            "delivery_attempt": attempt,
            "lease_expires": lease,
            "dead_letter_key": pa.nulls(n, pa.int64()) if mark is None else pa.repeat(pa.scalar(mark, pa.int64()), n),
            # The delivery history's columns (``delivery/history``): null on delivery rows.
            **{f.name: pa.nulls(n, f.type) for f in HISTORY_COLUMNS},
        },
        schema=SOURCE_SCHEMA,
    )


def cascade_rows(sub_uid: str, ended: pa.Table) -> pa.Table:
    """CASCADE source rows ending the deliveries `ended` (message_id, delivery_attempt)."""
    return source_rows(Op.CASCADE, sub_uid, ended, ended["delivery_attempt"], pa.repeat(pa.scalar(CASCADED_US, TS), ended.num_rows))


def empty_source() -> pa.Table:
    return SOURCE_SCHEMA.empty_table()


def pinned_on(sub_uids: Sequence[str], history: bool = False) -> str:
    """The MERGE condition, pinned by literal sub_uids (Delta's conflict check then only
    sees those partitions). One subscription: ``t.sub_uid = 'x'``; several: ``IN (...)``.
    `history`: the source holds HISTORY rows; with one subscription (whose condition joins on
    message_id alone) they are kept out of the join, so they never match that subscription's
    row of their message (no clause would apply, but a target row matched by two source rows
    is an error in Delta). With several, ``t.sub_uid = s.sub_uid`` already keeps them out."""
    if not sub_uids:
        raise ValueError("sub_uids: at least one subscription to pin the MERGE to")
    if len(sub_uids) == 1:
        keep_out = f" AND s.op <> '{Op.HISTORY.value}'" if history else ""
        return f"t.sub_uid = {literal(sub_uids[0])} AND t.message_id = s.message_id{keep_out}"
    in_list = ", ".join(literal(u) for u in sorted(sub_uids))
    return f"t.sub_uid IN ({in_list}) AND t.sub_uid = s.sub_uid AND t.message_id = s.message_id"


def _check_pinned(source: pa.Table, sub_uids: Sequence[str]) -> None:
    """Refuse a source row for a subscription the MERGE is not pinned to.

    The one-subscription condition joins on message_id alone (no ``t.sub_uid =
    s.sub_uid``), and message ids are shared by every subscription of a topic: a stray
    row for another subscription would ack or lease this one's row of that message.
    Checking here keeps the MERGE condition (and its cost) as it is; pc.unique over the
    source column is one pass over an Arrow array."""
    stray = {u for u in pc.unique(source["sub_uid"]).to_pylist() if not str(u).startswith(HISTORY_PREFIX)} - set(sub_uids)
    if stray:
        raise ValueError(
            f"sub_uid: source rows for {sorted(map(str, stray))} but the MERGE is pinned to {sorted(sub_uids)};"
            " every source row must belong to a pinned subscription"
        )


def ops_in(source: pa.Table) -> list[Op]:
    return [Op(v) for v in pc.unique(source["op"]).to_pylist()]


def new_messages_only(snap: Snapshot, parts: Sequence[pa.Table], txns: Sequence[tuple[str, int]]) -> bool:
    """Whether `parts` may commit as an append (``_append_new``), but for the absence of
    their rows, which ``commit`` checks on the snapshot: every row inserts a newly
    fanned-out message, exactly the cursor's transaction rides along, and the engine's
    append commits on the snapshot it was decided on. Reads nothing."""
    rows = [p for p in parts if p.num_rows]
    return (
        bool(rows) and len(txns) == 1 and snap.appends_on_snapshot
        and all(set(ops_in(p)) <= _APPENDABLE for p in rows) and any(Op.INSERT in ops_in(p) for p in rows)
    )


# Ops whose rows may go as a blind append: fan-out inserts, and history rows (insert only).
_APPENDABLE = frozenset({Op.INSERT, Op.HISTORY})


def _any_present(snap: Snapshot, source: pa.Table, sub_uids: Sequence[str]) -> bool:
    """Whether any source row's message already has a row in the snapshot (its partition).

    The cursor does not prove absence by itself: a crash between a push batch's MERGE and its
    cursor's commit (delta-spark records the cursors one commit each) leaves rows past the
    cursor, which the MERGE's insert-if-absent skipped and an append would write twice. Ids
    are time-ordered, so only the newest files (by their message_id range) are opened."""
    inserts = source.filter(pc.equal(source["op"], Op.INSERT.value))
    return any(read_by_ids(snap, inserts["message_id"], ["message_id"], partition=uid).num_rows for uid in sub_uids)


def _append_new(snap: Snapshot, source: pa.Table, txn: tuple[str, int]) -> Mapping[str, int]:
    """Commit INSERT-only source rows as a blind append, in message-id order (the layout a
    MERGE writes), with the fan-out cursor's application transaction.

    Equivalent to the MERGE's insert-if-absent only where ``commit`` takes this path: none of
    the messages has a row in the snapshot (``_any_present``), and the append commits on that
    very snapshot (``Snapshot.appends_on_snapshot``: delta-rs), so another writer fanning out
    the same versions, which commits the same app id, makes one of the two conflict and rerun
    on a fresh snapshot. Why (measured with deltalake 1.6.6, a server round of ~50 new
    messages, uncontended): a MERGE costs ~17 ms of CPU whatever its size, an append ~3-7 ms;
    the server's lease rounds for fresh messages, the latency path of every new message, are
    such rounds."""
    rows = source.drop_columns(["op"]).take(pc.sort_indices(source, [("message_id", "ascending")]))
    snap.append(rows, txn)
    return {"num_target_rows_inserted": rows.num_rows}


_DELETES = frozenset({Op.ACK, Op.SEEK_DROP})
_UPDATES = frozenset({Op.NACK, Op.DEADLINE, Op.SEEK_KEEP, Op.LEASE})


def _short(metrics: Mapping[str, int], source: pa.Table, exact: frozenset[Op]) -> str | None:
    """Why the MERGE did less than the rows of the `exact` ops (decided on the snapshot, so
    each must apply) ask, or None. Deletes and inserts are counted per op kind; updates
    against every update row of the source."""
    ops = source["op"]

    def count(kinds: frozenset[Op]) -> int:
        return _count(ops, kinds) if kinds else 0

    # Every update row counts, not only the exact ops': the other update rows of such a
    # commit (leases, marks, cascades) were decided on the same snapshot too, and an applied
    # one must not hide a refused exact row in the sum (review).
    wanted = {
        "num_target_rows_deleted": count(exact & _DELETES),
        "num_target_rows_inserted": count(exact & {Op.INSERT}),
        "num_target_rows_updated": count(_UPDATES | {Op.GIVE_UP, Op.CASCADE}),
    }
    for key, n in wanted.items():
        if n and metrics.get(key, 0) < n:
            return f"{key} {metrics.get(key, 0)} < {n}"
    return None


def commit(
    snap: Snapshot,
    parts: Sequence[pa.Table],
    sub_uids: Sequence[str],
    txns: Sequence[tuple[str, int]] = (),
    *,
    exact: frozenset[Op] = frozenset(),
) -> Mapping[str, int] | None:
    """Write source `parts` (SOURCE_SCHEMA) and application transactions `txns` as ONE commit:
    a MERGE pinned to `sub_uids` when there are rows (an append when they are all INSERT
    rows of absent messages with the cursor's txn, on delta-rs: ``_append_new``), else a commit of the txns alone, else nothing.
    Returns the MERGE's metrics (an append's: num_target_rows_inserted; None when nothing
    but txns or nothing was written). This is the only
    function of the core that writes. Raises ValueError, writing nothing, when a source
    row's sub_uid is not one of `sub_uids`.

    `exact`: ops whose rows were decided on this snapshot after reading their rows (a seek;
    outcomes that report per-id results), so every one of them must apply. When the MERGE
    did less (delta-spark, whose MERGE reads the table again: a commit landing after the
    snapshot's check), ``WriteRaced`` reruns the decision on a fresh snapshot, so no result
    says SUCCESS for a change that did not happen."""
    parts = [p for p in parts if p.num_rows]
    if not parts:
        if txns:
            snap.commit_txns(list(txns))
        return None
    source = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    _check_pinned(source, sub_uids)
    if new_messages_only(snap, parts, txns) and not _any_present(snap, source, sub_uids):
        return _append_new(snap, source, txns[0])
    if not txns and snap.appends_on_snapshot and ops_in(source) == [Op.HISTORY]:
        # History alone (outcomes that all turned out stale): nothing of a delivery changes,
        # so a blind append, which conflicts with nothing.
        snap.append(source.drop_columns(["op"]))
        return {"num_target_rows_inserted": source.num_rows}
    ops = ops_in(source)
    metrics = snap.merge(source, pinned_on(sub_uids, Op.HISTORY in ops), clauses_for(ops), app_txn=list(txns) or None)
    if exact:
        short = _short(metrics, source, exact)
        if short is not None:
            raise WriteRaced(f"rows decided on the snapshot did not all apply ({short}): another writer came first")
    leasing = _lease_mask(source)
    if pc.any(leasing).as_py():
        # Every update row of the source (leases, nacks, deadline changes, marks, cascades)
        # and every insert (new messages, leased or not, and history rows) was decided on the
        # snapshot. On delta-spark a commit in the window before the MERGE's own read can make
        # some not apply: a lease refused by its compare-and-set, a new message's insert
        # skipped because another writer fanned it out first, an outcome or mark whose row
        # moved. The counts cannot say which, and one row that did less can hide behind
        # another kind that did more only if all are summed, so each kind is compared to its
        # own total. ``applied_leases`` then reads back which leases the table holds as
        # written, and the caller hands out those alone (delta-rs merges exactly its
        # snapshot; its shortfall is a row already there, as after a crash between a
        # delta-spark MERGE and its cursor's commit, and the read-back settles that too).
        column = source["op"]
        want = {
            "num_target_rows_updated": _count(column, _UPDATES | {Op.GIVE_UP, Op.CASCADE}),
            "num_target_rows_inserted": _count(column, frozenset({Op.INSERT, Op.HISTORY})),
        }
        fell = [f"{k} {metrics.get(k, n)} < {n}" for k, n in want.items() if metrics.get(k, n) < n]
        if fell:
            raise LeasesRaced(f"rows decided on the snapshot did not all apply ({', '.join(fell)}): another writer came first",
                              source.select(list(LEASE_KEY)).filter(leasing))
    return metrics


def _count(ops: pa.ChunkedArray | pa.Array, kinds: frozenset[Op]) -> int:
    return int(pc.sum(pc.is_in(ops, pa.array([k.value for k in kinds], pa.string()))).as_py() or 0)


def _lease_mask(source: pa.Table) -> pa.ChunkedArray:
    """Which source rows grant a lease: LEASE rows, and INSERT rows of new messages leased in
    the same commit (``selection.select``: attempt 1 with a lease_expires). A mask, not the
    rows: every leasing commit asks, and only a raced one needs them (a push batch's source
    may hold 100k rows with the history's columns)."""
    ops = source["op"]
    insert_leased = pc.and_(pc.equal(ops, Op.INSERT.value), pc.is_valid(source["lease_expires"]))
    return pc.or_(pc.equal(ops, Op.LEASE.value), pc.fill_null(insert_leased, False))


# What identifies a lease once written: a lease sets delivery_attempt by compare-and-set, so of
# two writers that decided one row only one applies, and the lease_expires it wrote (a
# microsecond timestamp of its own "now") tells which one did.
LEASE_KEY = ("sub_uid", "message_id", "delivery_attempt", "lease_expires")


class LeasesRaced(WriteRaced):
    """A committed MERGE that granted leases applied fewer rows of some kind than decided.
    `decided`: the rows that grant a lease (``LEASE_KEY``; LEASE rows and leased INSERTs).
    Callers that can hand out part of a decision pass it to ``applied_leases``; the others let ``transact`` rerun, as for any ``WriteRaced``, and the
    leases that did apply then expire unused (those messages come back a lease later)."""

    def __init__(self, message: str, decided: pa.Table) -> None:
        super().__init__(message)
        self.decided = decided


def applied_leases(latest: Snapshot, raced: LeasesRaced) -> frozenset[tuple[str, str]]:
    """The (sub_uid, message_id) of `raced`'s leases that the table holds as written, read on
    `latest` (a snapshot taken after the commit). Nobody else can have moved such a row since:
    its ack ids are not handed out yet and its lease runs. The other writer's lease of the same
    attempt has its own lease_expires; both equal would take two decisions in one microsecond,
    and the cost of that is a duplicate delivery, never a lost one."""
    won: set[tuple[str, str]] = set()
    decided = raced.decided
    for uid in pc.unique(decided["sub_uid"]).to_pylist():
        mine = decided.filter(pc.equal(decided["sub_uid"], uid))
        held = read_by_ids(latest, mine["message_id"], ["message_id", "delivery_attempt", "lease_expires"], partition=uid)
        now = set(zip(*_lease_values(held)))
        won |= {(uid, m) for m, a, e in zip(*_lease_values(mine)) if (m, a, e) in now}
    return frozenset(won)


def _lease_values(rows: pa.Table) -> tuple[list[str], list[int], list[int]]:
    # Compared as plain values: a read may give string_view ids and another timestamp type.
    return (rows["message_id"].cast(pa.string()).to_pylist(), rows["delivery_attempt"].cast(pa.int64()).to_pylist(),
            rows["lease_expires"].cast(TS).cast(pa.int64()).to_pylist())
