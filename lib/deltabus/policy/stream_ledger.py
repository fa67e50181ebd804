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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

PENDING = "pending"
PLANNED = "planned"
STATES = (PENDING, PLANNED)

# (message_id, message_version): a delivery's identity across attempts (a seek makes a new version).
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Ledger:
    """next: the number the next batch gets. batches: live batch -> state. unsettled:
    messages of committed batches whose ack did not apply, with the time they stop counting
    (so the message is acked, not emitted, when it is leased to this source again)."""

    next: int = 1
    batches: Mapping[int, str] = field(default_factory=dict)
    unsettled: Mapping[Key, float] = field(default_factory=dict)

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
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "Ledger":
        batches = doc.get("batches") or {}
        unsettled = doc.get("unsettled") or []
        assert isinstance(batches, Mapping) and isinstance(unsettled, list)
        next_ = doc.get("next", 1)
        assert isinstance(next_, int)
        return cls(
            next=next_,
            batches={int(n): str(s) for n, s in batches.items()},
            unsettled={(str(m), int(v)): float(t) for m, v, t in unsettled},
        )


def new_batch(ledger: Ledger) -> tuple[Ledger, int]:
    """A new pending batch (its manifest is written first); refused while one is pending."""
    if ledger.pending is not None:
        raise ValueError(f"batch {ledger.pending} is still pending")
    n = ledger.next
    return replace(ledger, next=n + 1, batches={**ledger.batches, n: PENDING}), n


def committed_by(ledger: Ledger, start: int, *, inclusive: bool = True) -> list[int]:
    """Live batches Spark has committed when it plans a batch after `start` (inclusive) or
    probes `start` on restart (exclusive: the newest logged batch may be uncommitted).
    Spark runs batches one after another, so every planned batch below is committed."""
    return sorted(n for n, s in ledger.batches.items() if s == PLANNED and (n <= start if inclusive else n < start))


def plan(ledger: Ledger, start: int, end: int) -> tuple[Ledger, list[int]]:
    """Spark plans (start, end]: `end` becomes planned; the batches committed by then (to ack)."""
    if end == 0:
        return ledger, committed_by(ledger, start)
    if end not in ledger.batches:
        raise LookupError(
            f"batch {end} is not in the ledger (acked already, or the ledger was deleted or belongs to another "
            "query): use a new checkpoint location or another consumer"
        )
    return replace(ledger, batches={**ledger.batches, end: PLANNED}), committed_by(ledger, start)


def abandoned(ledger: Ledger, start: int, end: int) -> list[int]:
    """Batches no lineage of Spark's will commit once it plans (start, end]: a plan from the
    initial offset (0) starts a lineage (a new checkpoint) that committed nothing, so the
    other planned batches belong to an older checkpoint. They are dropped and nacked, no
    longer absorbing: their messages are delivered again (to this query too)."""
    if start != 0:
        return []
    return sorted(n for n, s in ledger.batches.items() if s == PLANNED and n != end)


def drop(ledger: Ledger, batches: Iterable[int]) -> Ledger:
    gone = set(batches)
    return replace(ledger, batches={n: s for n, s in ledger.batches.items() if n not in gone})


def probe(ledger: Ledger, last: int) -> tuple[Ledger, list[int]]:
    """Spark restarts with `last` the newest offset in its log: that batch is planned (it may
    be replayed); the ones before it are committed (to ack). A pending batch above it is an
    orphan: it stays pending and is offered as the next batch."""
    to_ack = committed_by(ledger, last, inclusive=False)
    if ledger.batches.get(last) == PENDING:
        ledger = replace(ledger, batches={**ledger.batches, last: PLANNED})
    return ledger, to_ack


def acked(ledger: Ledger, n: int, failed: Iterable[Key], expires_at: float) -> Ledger:
    """Batch `n`'s ack ran; `failed` are the deliveries whose ack did not apply."""
    batches = {k: v for k, v in ledger.batches.items() if k != n}
    unsettled = dict(ledger.unsettled)
    for key in failed:
        unsettled[key] = expires_at
    return replace(ledger, batches=batches, unsettled=unsettled)


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
