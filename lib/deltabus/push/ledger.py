"""The driver's ledger of pushes (``PushLedger``): queued, handed to a worker, settled, or lost. No I/O.

The push job queues the requests of each micro-batch's leases here; push workers take
them in *assignments* and report an outcome per request. The job collects outcomes (and
anything lost) at its next micro-batch. A request is lost when it waited longer than its
lease (its ack deadline: by then the lease has expired and the plan leases it again), when
its worker never reported it within its deadline plus ``grace``, or when its worker is
gone. Lost requests are only forgotten, never pushed on purpose again: their leases expire
in Delta and the normal redelivery takes over.

Bytes: the ledger counts the message bytes (data and attribute values: ``message_sizes``)
of every push not yet settled or given up on, queued or with a worker
(``outstanding_bytes``); the job leases no more than its byte cap leaves
(``Settings.max_queued_bytes``), so neither the driver's queue nor the workers' hands hold
more than that.

Thread-safe: the job's thread queues and collects, the pool's HTTP server thread hands out
and settles; every method takes the one lock. How much of each subscription goes into one
assignment is ``policy/handout.py``'s decision. (Formerly ``dispatcher.py``/``Dispatcher``: it
dispatches nothing itself, workers pull from it.)
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..policy.handout import allocate
from .wire import RESULT_SCHEMA, WORK_SCHEMA

Key = tuple[str, str]  # (sub_uid, message_id)


def message_sizes(requests: pa.Table) -> list[int]:
    """Each request row's message bytes: its data plus its attribute values (what a push
    holds of its message; the leases' size_bytes count the same)."""
    sizes = np.asarray(pc.fill_null(pc.binary_length(requests["data"]), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    out = sizes.copy()
    start = 0
    for chunk in requests["attributes"].chunks:
        n = len(chunk)
        if n:  # a map array's items are shared by its slices: its own offsets bound them
            offsets = np.asarray(chunk.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
            lengths = np.asarray(pc.fill_null(pc.binary_length(chunk.items), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
            cum = np.concatenate([[0], np.cumsum(lengths)])
            out[start:start + n] += cum[offsets[1:]] - cum[offsets[:-1]]
        start += n
    return [int(v) for v in out]


@dataclass(slots=True)
class _Queued:
    table: pa.Table  # request rows of one subscription
    expires: float


@dataclass(slots=True)
class _Assignment:
    worker: str
    keys: set[Key]
    deadline: float


@dataclass(slots=True)
class Collected:
    outcomes: pa.Table  # RESULT_SCHEMA rows reported since the last collect
    lost: list[Key] = field(default_factory=list)


class PushLedger:
    """Every push the job queued and not yet settled or given up on; see the module docstring."""

    def __init__(
        self, *, grace: float = 30.0, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self.grace = grace
        self._clock = clock
        self._wall = wall  # for the requests' lease_expires (epoch time)
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[_Queued]] = {}
        self._queued_rows: collections.Counter[str] = collections.Counter()
        self._sizes: dict[Key, int] = {}  # message bytes of every push not yet settled or given up on
        self._bytes = 0  # their sum (outstanding_bytes)
        self.peak_bytes = 0  # the most ever outstanding at once
        self._assigned: dict[int, _Assignment] = {}
        self._next = 0
        self._rr = 0
        self._results: list[pa.Table] = []
        self._lost: list[Key] = []

    # -- the job's side ---------------------------------------------------------------
    def submit(self, sub_uid: str, requests: pa.Table) -> None:
        """Queue one subscription's requests (REQUEST_SCHEMA rows, all of `sub_uid`)."""
        if requests.num_rows == 0:
            return
        # Not before its lease ends: a worker may still send it until then (a lease runs past
        # one ack deadline when the job adds its commit time, policy/lease_start.py).
        timeout = max(float(pc.max(requests["timeout_seconds"]).as_py()), self._lease_left(requests))
        sizes = message_sizes(requests)
        with self._lock:
            self._queues.setdefault(sub_uid, collections.deque()).append(_Queued(requests, self._clock() + timeout))
            self._queued_rows[sub_uid] += requests.num_rows
            for mid, size in zip(requests["message_id"].to_pylist(), sizes):
                self._bytes += size - self._sizes.get((sub_uid, mid), 0)
                self._sizes[(sub_uid, mid)] = size
            self.peak_bytes = max(self.peak_bytes, self._bytes)

    def _forget(self, keys: list[Key] | set[Key]) -> None:
        """(Under the lock.) Settled or given up on: their bytes are free."""
        for key in keys:
            self._bytes -= self._sizes.pop(key, 0)

    def collect(self) -> Collected:
        """Outcomes reported since the last call, and requests given up on."""
        now = self._clock()
        with self._lock:
            for uid, queue in self._queues.items():
                while queue and queue[0].expires <= now:
                    q = queue.popleft()
                    self._queued_rows[uid] -= q.table.num_rows
                    self._lost.extend((uid, m) for m in q.table["message_id"].to_pylist())
            for aid in [a for a, asg in self._assigned.items() if asg.deadline <= now]:
                self._lost.extend(self._assigned.pop(aid).keys)
            results, self._results = self._results, []
            lost, self._lost = self._lost, []
            self._forget(lost)
        table = pa.concat_tables(results) if results else RESULT_SCHEMA.empty_table()
        return Collected(table, lost)

    def outstanding(self) -> int:
        """Requests queued or with a worker, not yet settled."""
        with self._lock:
            return sum(self._queued_rows.values()) + sum(len(a.keys) for a in self._assigned.values())

    def settled_within(self) -> float:
        """Seconds from now until the last request held (queued or handed out) is settled or
        given up on at the latest: each one's own give-up time, which covers its own lease
        (``submit``), so a lease granted with a longer allowance than today's is waited for.
        0 when nothing is held."""
        now = self._clock()
        with self._lock:
            ends = [q.expires for queue in self._queues.values() for q in queue]
            ends.extend(a.deadline for a in self._assigned.values())
        return max(0.0, max(ends, default=now) - now)

    def queued(self) -> int:
        with self._lock:
            return sum(self._queued_rows.values())

    def outstanding_bytes(self) -> int:
        """Message bytes of the pushes queued or with a worker, not yet settled or given up on."""
        with self._lock:
            return self._bytes

    def drop_queued(self) -> int:
        """Forget everything not yet handed out (as lost); how many."""
        with self._lock:
            n = 0
            for uid, queue in self._queues.items():
                for q in queue:
                    self._lost.extend((uid, m) for m in q.table["message_id"].to_pylist())
                    n += q.table.num_rows
                queue.clear()
            self._queued_rows.clear()
            return n

    def workers_gone(self, workers: set[str] | None = None) -> int:
        """The given workers (all when None) are gone: what they held is lost. How many."""
        with self._lock:
            gone = [a for a, asg in self._assigned.items() if workers is None or asg.worker in workers]
            n = 0
            for aid in gone:
                keys = self._assigned.pop(aid).keys
                self._lost.extend(keys)
                n += len(keys)
            return n

    # -- the workers' side ------------------------------------------------------------
    def has_queued(self) -> bool:
        with self._lock:
            return any(self._queued_rows.values())

    def hand_out(self, worker: str, held: dict[str, int], *, per_sub: int, limit: int) -> pa.Table | None:
        """One assignment for `worker` (WORK_SCHEMA rows), or None when there is nothing it can take."""
        now = self._clock()
        with self._lock:
            subs = [u for u, n in self._queued_rows.items() if n > 0]
            if not subs:
                return None
            self._rr = (self._rr + 1) % len(subs)
            order = subs[self._rr:] + subs[: self._rr]
            counts = allocate(order, self._queued_rows, held, per_sub=per_sub, limit=limit)
            parts: list[pa.Table] = []
            deadline = now
            for uid, n in counts.items():
                queue = self._queues[uid]
                self._queued_rows[uid] -= n
                while n > 0:
                    head = queue[0]
                    if head.table.num_rows <= n:
                        queue.popleft()
                        part = head.table
                    else:
                        part = head.table.slice(0, n)
                        head.table = head.table.slice(n)
                    parts.append(part)
                    n -= part.num_rows
                    deadline = max(deadline, now + max(float(pc.max(part["timeout_seconds"]).as_py()), self._lease_left(part)))
            if not parts:
                return None
            table = pa.concat_tables(parts)
            aid = self._next
            self._next += 1
            keys = set(zip(table["sub_uid"].to_pylist(), table["message_id"].to_pylist()))
            self._assigned[aid] = _Assignment(worker, keys, deadline + self.grace)
        return table.append_column(WORK_SCHEMA.field("assignment"), pa.repeat(pa.scalar(aid, pa.int64()), table.num_rows))

    def _lease_left(self, requests: pa.Table) -> float:
        """Seconds until the latest lease among `requests` ends (0 without lease_expires)."""
        if "lease_expires" not in requests.column_names:
            return 0.0
        latest = pc.max(requests["lease_expires"].cast(pa.int64())).as_py()
        return 0.0 if latest is None else max(0.0, latest / 1e6 - self._wall())

    def settle(self, results: pa.Table) -> None:
        """A worker's outcomes (RESULT_SCHEMA). Outcomes of an assignment already given up on
        still count: the push happened, and acking it saves a redelivery."""
        aids = results["assignment"].to_pylist()
        uids = results["sub_uid"].to_pylist()
        mids = results["message_id"].to_pylist()
        with self._lock:
            self._results.append(results)
            for aid, uid, mid in zip(aids, uids, mids):
                self._forget([(uid, mid)])
                asg = self._assigned.get(aid)
                if asg is None:
                    continue
                asg.keys.discard((uid, mid))
                if not asg.keys:
                    del self._assigned[aid]
