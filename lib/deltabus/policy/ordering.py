"""Ordering keys (issue 13): which candidates may be leased now, and which leases a nack ends.

Contract, for a subscription with ``enable_message_ordering`` (pure: Arrow in, Arrow out;
no clock, no table reads):

- Order. A key's messages are in publish order when sorted by (message_version,
  message_id): one publisher commits a key's batches one after another (one version
  each), and the ids of one batch sort in publish order (``ids``). Lease selection hands
  candidates in that order (available rows first, then new messages, which come from later
  versions), so a key's candidates are already in publish order.
- ``KeyState`` is what selection reads besides the candidates: ``held``, the keys that have
  a delivery that is not due (a lease running, a nack waiting out its retry delay) or one
  the push job has in flight; and ``complete``, whether the available rows read are every
  row available now (a read cut at its limit may have left older rows of a key unread).
- ``eligible``: a candidate without a key (empty or null) may always go. A candidate of a
  held key may not (the next batch of a key waits until nothing of it is outstanding).
  A new message with a key may not when the available read was cut (an older row of its
  key may be unread). With ``one_per_key`` (push: one outstanding message per key) only
  the first remaining candidate of each key may go; otherwise (pull, ``subscribe()``) every
  candidate of a free key may, in order. What is left eligible is a prefix of each key's
  candidates, so any prefix of the candidates selection then takes keeps each key in order.
- ``followers``: the nack cascade. A nack (or expiry reported as one) of a message ends the
  leases of the later outstanding messages of its key, so they are redelivered after it,
  in order. Messages without a key are never affected.
- ``ran_out``: the same cascade for a lease that ran out. Nobody reports an expiry, so the
  next lease decision finds it: a message whose lease ran out (a delivery that was not
  nacked) ends the leases still running of the later messages of its key. The decision
  that ends them leases nothing of that key (its ended rows were still leased in its
  snapshot, so the key is held); the next one hands the key out again from its head.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["KeyState", "NO_KEYS", "NO_ENDED", "keyed", "eligible", "followers", "ran_out"]

# message_id and delivery_attempt: the deliveries a cascade ends.
ENDED_SCHEMA = pa.schema([("message_id", pa.string()), ("delivery_attempt", pa.int32())])
NO_ENDED = ENDED_SCHEMA.empty_table()


class KeyState(NamedTuple):
    """The ordering state of one subscription at one snapshot (see the module docstring)."""

    held: pa.Array  # string: keys with a delivery outstanding, waiting or in flight
    complete: bool  # the available rows read are all the rows available now
    ended: pa.Table = NO_ENDED  # leases to end with this decision (``ran_out``), ENDED_SCHEMA


NO_KEYS = KeyState(pa.array([], pa.string()), True)


def keyed(keys: pa.Array | pa.ChunkedArray) -> pa.Array:
    """True where a row has an ordering key (not null, not empty)."""
    flat = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    return pc.fill_null(pc.not_equal(flat, ""), False)


def _first_of_key(keys: pa.Array, mask: pa.Array) -> pa.Array:
    """Of the rows `mask` allows, True only at the first row of each key (keyless rows stay)."""
    n = len(keys)
    if n == 0:
        return mask
    idx = pa.array(range(n), pa.int64())
    has_key = keyed(keys)
    pick = pc.and_(mask, has_key)
    t = pa.table({"k": keys, "i": idx}).filter(pick)
    firsts = t.group_by("k").aggregate([("i", "min")])["i_min"].combine_chunks() if t.num_rows else pa.array([], pa.int64())
    first = pc.is_in(idx, value_set=firsts)
    return pc.and_(mask, pc.or_(pc.invert(has_key), first))


def eligible(
    available: pa.Table, fresh: pa.Table, state: KeyState, *, one_per_key: bool
) -> tuple[pa.Array, pa.Array]:
    """(mask over `available`, mask over `fresh`): True = may be leased now. Both tables carry
    ``ordering_key`` and are in lease order; see the module docstring for the rule."""
    a, f = available.num_rows, fresh.num_rows
    keys = pa.concat_arrays(
        [available["ordering_key"].combine_chunks().cast(pa.string()), fresh["ordering_key"].combine_chunks().cast(pa.string())]
    )
    has_key = keyed(keys)
    free = pc.invert(pc.fill_null(pc.is_in(keys, value_set=state.held), False))
    mask = pc.or_(pc.invert(has_key), free)
    if not state.complete and f:
        fresh_part = pa.concat_arrays([pa.repeat(pa.scalar(False), a), pa.repeat(pa.scalar(True), f)])
        mask = pc.and_(mask, pc.invert(pc.and_(has_key, fresh_part)))
    if one_per_key:
        mask = _first_of_key(keys, mask)
    return mask.slice(0, a), mask.slice(a, f)


def followers(nacked: pa.Table, rows: pa.Table) -> pa.Table:
    """The rows whose lease a nack of `nacked` (message_id, delivery_attempt) ends as well: of `rows` (the
    subscription's outstanding rows and the nacked ones: message_id, message_version,
    ordering_key, delivery_attempt), those of a nacked message's key that come after the
    earliest nacked message of that key, not nacked themselves (a nack naming an earlier
    delivery than the current one ends nothing). Returns message_id and
    delivery_attempt (the delivery to end), in order."""
    out_schema = ENDED_SCHEMA
    if nacked.num_rows == 0 or rows.num_rows == 0:
        return out_schema.empty_table()
    rows = rows.filter(keyed(rows["ordering_key"]))
    wanted = dict(zip(nacked["message_id"].to_pylist(), nacked["delivery_attempt"].to_pylist()))
    is_nacked = pc.is_in(rows["message_id"], value_set=pa.array(list(wanted), pa.string()))
    heads = rows.filter(is_nacked)
    # Only a nack that applies (it names the current delivery) ends the leases after it.
    heads = heads.filter(pa.array([wanted[m] == a for m, a in zip(heads["message_id"].to_pylist(), heads["delivery_attempt"].to_pylist())], pa.bool_()))
    if heads.num_rows == 0:
        return out_schema.empty_table()
    first: dict[str, tuple[int, str]] = {}
    for k, v, m in zip(heads["ordering_key"].to_pylist(), heads["message_version"].to_pylist(), heads["message_id"].to_pylist()):
        if k not in first or (v, m) < first[k]:
            first[k] = (v, m)
    rest = rows.filter(pc.and_(pc.invert(is_nacked), pc.is_in(rows["ordering_key"], value_set=pa.array(list(first), pa.string()))))
    take = [
        (v, m) > first[k]
        for k, v, m in zip(rest["ordering_key"].to_pylist(), rest["message_version"].to_pylist(), rest["message_id"].to_pylist())
    ]
    after = rest.filter(pa.array(take, pa.bool_())).sort_by([("message_version", "ascending"), ("message_id", "ascending")])
    return pa.table(
        {"message_id": after["message_id"].cast(pa.string()), "delivery_attempt": after["delivery_attempt"].cast(pa.int32())},
        schema=out_schema,
    )


def ran_out(rows: pa.Table, now_us: int, nacked_max_us: int) -> pa.Table:
    """The leases a lease that ran out ends (``ran_out`` in the module docstring): of `rows`
    (message_id, message_version, ordering_key, delivery_attempt, lease_expires as int64 us,
    for rows with a key and a lease), the rows still leased at `now_us` that come after an
    earlier message of their key whose lease ran out (attempt >= 1, lease_expires above
    `nacked_max_us`, the nacked mark, and at or before `now_us`). ENDED_SCHEMA, in order."""
    if rows.num_rows == 0:
        return NO_ENDED
    lease = rows["lease_expires"]
    expired = pc.and_(
        pc.and_(pc.greater(lease, nacked_max_us), pc.less_equal(lease, now_us)),
        pc.greater_equal(rows["delivery_attempt"], 1),
    )
    heads = rows.filter(pc.fill_null(expired, False))
    running = rows.filter(pc.fill_null(pc.greater(lease, now_us), False))
    if heads.num_rows == 0 or running.num_rows == 0:
        return NO_ENDED
    # Only a key with a running lease can have one to end, and only its earliest run-out head
    # decides: Arrow narrows the heads before the per-row work (a backlog of run-out leases
    # waiting to be leased again costs one filter, not a Python loop per row).
    heads = heads.filter(pc.is_in(heads["ordering_key"], value_set=pc.unique(running["ordering_key"].combine_chunks())))
    if heads.num_rows == 0:
        return NO_ENDED
    heads = heads.sort_by([("ordering_key", "ascending"), ("message_version", "ascending"), ("message_id", "ascending")])
    keys = heads["ordering_key"].combine_chunks()
    first = pa.concat_arrays([pa.array([True]), pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))])
    heads = heads.filter(first)
    columns = ["message_id", "message_version", "ordering_key", "delivery_attempt"]
    both = pa.concat_tables([heads.select(columns), running.select(columns)])
    return followers(heads.select(["message_id", "delivery_attempt"]), both)
