"""The streaming source's ledger decisions (issue 17, docs/design/issue-17-streaming-source.md §3.3-3.6).

Pure: a ``Ledger`` value and functions that return the next value plus what to do (which
batches to ack, which leases to emit). ``deltabus.spark.streaming`` does the I/O (manifests,
``state.json``, pulls, acks) around them.

Batches are numbered 1, 2, ... (0 is Spark's initial offset and has no manifest). A batch is
``pending`` from the moment its manifest is durable until Spark plans it (``partitions``
with it as ``end``), then ``planned`` until Spark has committed it and its ack ran; then it
leaves the ledger. At most one batch is pending: ``latestOffset`` offers it again (also one
an earlier run made and never saw planned) instead of leasing more, so an orphan is never
lost, and a batch Spark logged but did not plan before a crash is the one it replays.

Each planned batch records its *link*: the offset Spark planned it from (``plan(start, end)``
sets ``links[end] = start``). Spark commits a batch only after the one it was planned from, so
what a query has committed is the chain ``end, links[end], links[links[end]], ...``: acks
follow that chain and nothing else. Why chains and not "refuse a plan whose start is not the
newest planned batch": Spark's restart replays its last logged batch with the same
(start, end), from its offset log, after a probe of that end; with links the replay is
recognised exactly (``links[end] == start``), an older checkpoint that resumes after another
ran keeps working, and a batch another checkpoint planned is never acked by this one's
commits (``committed_by`` used to ack every planned batch numbered at or below the commit).
A plan that contradicts a recorded link (the same batch planned from another offset) is
refused: two checkpoints are planning one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

PENDING = "pending"
PLANNED = "planned"
STATES = (PENDING, PLANNED)

# (message_id, message_version): a delivery's identity across attempts (a seek makes a new version).
Key = tuple[str, int]


class LineageConflict(ValueError):
    """Spark planned a batch from another offset than the one it was planned from before:
    two checkpoints (queries) are reading one consumer's ledger."""


@dataclass(frozen=True, slots=True)
class Ledger:
    """next: the number the next batch gets. batches: live batch -> state. unsettled:
    messages of committed batches whose ack did not apply, with the time they stop counting
    (so the message is acked, not emitted, when it is leased to this source again). links:
    planned batch -> the offset Spark planned it from (0 = the initial offset); a planned
    batch without one was made planned by a restart probe and gets it at the replay (or
    comes from a ledger written before links existed)."""

    next: int = 1
    batches: Mapping[int, str] = field(default_factory=dict)
    unsettled: Mapping[Key, float] = field(default_factory=dict)
    links: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.next, bool) or not isinstance(self.next, int) or self.next < 1:
            raise ValueError(f"next must be an integer >= 1, got {self.next!r}")
        for n, state in self.batches.items():
            if not 1 <= n < self.next:
                raise ValueError(f"batch {n} is outside 1..{self.next - 1}")
            if state not in STATES:
                raise ValueError(f"batch {n} has state {state!r}, not one of {STATES}")
        if sum(1 for s in self.batches.values() if s == PENDING) > 1:
            raise ValueError("more than one pending batch")
        for end, start in self.links.items():
            if self.batches.get(end) != PLANNED:
                raise ValueError(f"link {end} -> {start}: batch {end} is not a planned batch")
            if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < end:
                raise ValueError(f"link {end} -> {start!r}: a batch is planned from an offset 0..{end - 1}")

    @property
    def pending(self) -> int | None:
        return next((n for n, s in self.batches.items() if s == PENDING), None)

    @property
    def newest_planned(self) -> int | None:
        planned = [n for n, s in self.batches.items() if s == PLANNED]
        return max(planned) if planned else None

    def to_json(self) -> dict[str, object]:
        return {
            "next": self.next,
            "batches": {str(n): s for n, s in sorted(self.batches.items())},
            "unsettled": [[m, v, t] for (m, v), t in sorted(self.unsettled.items())],
            "links": {str(e): b for e, b in sorted(self.links.items())},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "Ledger":
        batches = doc.get("batches") or {}
        unsettled = doc.get("unsettled") or []
        links = doc.get("links") or {}  # absent in ledgers written before links existed
        assert isinstance(batches, Mapping) and isinstance(unsettled, list) and isinstance(links, Mapping)
        next_ = doc.get("next", 1)
        assert isinstance(next_, int)
        return cls(
            next=next_,
            batches={int(n): str(s) for n, s in batches.items()},
            unsettled={(str(m), int(v)): float(t) for m, v, t in unsettled},
            links={int(e): int(b) for e, b in links.items()},
        )


def new_batch(ledger: Ledger) -> tuple[Ledger, int]:
    """A new pending batch (its manifest is written first); refused while one is pending."""
    if ledger.pending is not None:
        raise ValueError(f"batch {ledger.pending} is still pending")
    n = ledger.next
    return replace(ledger, next=n + 1, batches={**ledger.batches, n: PENDING}), n


def idle_offer(ledger: Ledger, known: int | None, newest_has_rows: bool) -> int | None:
    """What ``latestOffset`` offers when it leased nothing new and no batch is pending: the
    offset Spark already holds (`known`), or None for a new empty batch, made when

    - `known` is None: Spark has not yet said where this query is. ``Trigger.AvailableNow``
      asks ``latestOffset`` before ``initialOffset`` and the restart probe, and takes the
      answer as the target it reads up to. Any batch already in the ledger may be another
      (stopped) checkpoint's; offering it makes this query plan it from its own offset, a
      LineageConflict (and offering 0 could be below this query's offset). A new empty batch
      belongs to no lineage yet: Spark plans it from wherever the query is, which also
      commits (acks) that query's last batch and hands back another checkpoint's (abandoned).
    - the newest planned batch is the last one made and has rows (`newest_has_rows`): Spark
      commits a batch only when it plans the next one, so an empty batch lets its ack run
      now instead of waiting for the next message."""
    if known is None:
        return None
    newest = ledger.newest_planned
    if newest is not None and newest == ledger.next - 1 and newest_has_rows:
        return None
    return known


def committed_by(ledger: Ledger, end: int) -> list[int]:
    """The live batches Spark has committed once it committed the batch ending at `end`: the
    chain end, links[end], ... while those are planned batches of the ledger (a batch without
    a link ends it), oldest first (so an ack cut short leaves the chain's newer part linked).
    A batch another checkpoint planned is never on it, whatever its number."""
    chain: list[int] = []
    n: int | None = end
    while n is not None and n != 0 and ledger.batches.get(n) == PLANNED and n not in chain:
        chain.append(n)
        n = ledger.links.get(n)
    return sorted(chain)


def plan(ledger: Ledger, start: int, end: int) -> tuple[Ledger, list[int]]:
    """Spark plans (start, end]: `end` becomes planned from `start` (its link); the batches
    committed by then, the chain ending at `start`, are returned to ack. A replay (Spark's
    restart, same start and end) changes nothing; a plan of `end` from another start is a
    LineageConflict."""
    if end == 0:
        return ledger, committed_by(ledger, start)
    if end not in ledger.batches:
        raise LookupError(
            f"batch {end} is not in the ledger (acked already, or the ledger was deleted or belongs to another "
            "query): use a new checkpoint location or another consumer"
        )
    if not 0 <= start < end:
        raise ValueError(f"a batch is planned from an earlier offset: got ({start}, {end}]")
    linked = ledger.links.get(end)
    if linked is not None and linked != start:
        raise LineageConflict(
            f"batch {end} was planned from offset {linked} and is now planned from {start}: two checkpoints read "
            "this consumer's ledger; give each query its own consumer option"
        )
    after = replace(ledger, batches={**ledger.batches, end: PLANNED}, links={**ledger.links, end: start})
    return after, committed_by(ledger, start)


def abandoned(ledger: Ledger, start: int, end: int) -> list[int]:
    """Batches no lineage of Spark's will commit once it plans (start, end]. A plan from the
    initial offset (0) starts a lineage (a new checkpoint) that committed nothing, so every
    other planned batch belongs to an older checkpoint. Otherwise: planned batches below
    `end` that are linked but not on this plan's chain (end and the chain ending at
    `start`), i.e. planned by another checkpoint that has stopped (one running query per
    consumer). They are dropped and nacked, no longer absorbing: their messages are
    delivered again (to this query too) instead of being held for a checkpoint that may
    never resume. Unlinked planned batches (awaiting a replay) are kept."""
    if start == 0:
        return sorted(n for n, s in ledger.batches.items() if s == PLANNED and n != end)
    chain = {end, *committed_by(ledger, start)}
    return sorted(n for n, s in ledger.batches.items()
                  if s == PLANNED and n < end and n not in chain and n in ledger.links)


def drop(ledger: Ledger, batches: Iterable[int]) -> Ledger:
    gone = set(batches)
    return replace(ledger, batches={n: s for n, s in ledger.batches.items() if n not in gone},
                   links={n: b for n, b in ledger.links.items() if n not in gone})


def probe(ledger: Ledger, last: int) -> tuple[Ledger, list[int]]:
    """Spark restarts with `last` the newest offset in its log: that batch is planned (it may
    be replayed; a pending one gets its link at the replay); the chain behind it is committed
    (to ack). A pending batch above it is an orphan: it stays pending and is offered as the
    next batch."""
    behind = ledger.links.get(last) if ledger.batches.get(last) == PLANNED else None
    to_ack = committed_by(ledger, behind) if behind is not None else []
    if ledger.batches.get(last) == PENDING:
        ledger = replace(ledger, batches={**ledger.batches, last: PLANNED})
    return ledger, to_ack


def failed_after(ledger: Ledger, after: int) -> list[int]:
    """The batches of a query run that failed after completing the batch ending at `after`:
    the one it planned from `after` and a pending one (made, maybe not logged). Another
    checkpoint's batches are not among them, whatever their numbers."""
    return sorted(n for n, s in ledger.batches.items()
                  if n > after and (s == PENDING or ledger.links.get(n) == after))


def acked(ledger: Ledger, n: int, failed: Iterable[Key], expires_at: float) -> Ledger:
    """Batch `n`'s ack ran; `failed` are the deliveries whose ack did not apply."""
    batches = {k: v for k, v in ledger.batches.items() if k != n}
    links = {k: v for k, v in ledger.links.items() if k != n}
    unsettled = dict(ledger.unsettled)
    for key in failed:
        unsettled[key] = expires_at
    return replace(ledger, batches=batches, unsettled=unsettled, links=links)


def expire_unsettled(ledger: Ledger, now: float) -> Ledger:
    kept = {k: t for k, t in ledger.unsettled.items() if t > now}
    return ledger if len(kept) == len(ledger.unsettled) else replace(ledger, unsettled=kept)


@dataclass(frozen=True, slots=True)
class Absorbed:
    """What a pull's leases become: `emit` (new to this source, in lease order), `renewed`
    (already in live batch -> its new ack id), `ack_now` (unsettled: ack, do not emit)."""

    emit: list[int]
    renewed: dict[Key, int]
    ack_now: list[int]


def absorb(leases: Sequence[Key], live: Mapping[Key, int], unsettled: Mapping[Key, float]) -> Absorbed:
    """Split a pull's leases (by index) so no delivery is emitted twice by this source: one in
    a live batch (its lease lapsed and this source leased it again) goes back to that batch,
    one whose ack did not apply goes to ack_now. A new version (a seek) is a new delivery."""
    emit: list[int] = []
    renewed: dict[Key, int] = {}
    ack_now: list[int] = []
    for i, key in enumerate(leases):
        if key in live:
            renewed[key] = i
        elif key in unsettled:
            ack_now.append(i)
        else:
            emit.append(i)
    return Absorbed(emit, renewed, ack_now)


def parts_of(keys: Sequence[str], parts: int) -> list[int]:
    """The part each row goes to: every row of an ordering key to one part (crc32 of the key),
    keyless rows round-robin; rows keep their order inside a part."""
    import zlib

    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    out: list[int] = []
    rr = 0
    for key in keys:
        if key:
            out.append(zlib.crc32(key.encode()) % parts)
        else:
            out.append(rr % parts)
            rr += 1
    return out
