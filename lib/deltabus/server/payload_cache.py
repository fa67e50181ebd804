"""The payloads this server committed lately, kept in memory for the rounds that lease them.

Contract: ``put(rows)`` records the rows of a messages-table append that COMMITTED (the
Publish group commit calls it after its append); ``get(topic_uid, ids)`` returns the
cached ones as ``delivery.payloads.fetch_messages`` rows (``message_id``, ``data``,
``attributes`` as (key, value) pairs, ``ordering_key``, ``publish_time`` as a datetime),
and the ids it does not hold, which the caller reads from the table as before. A message's
payload never changes once committed and its id is never reused, so a cached row is the
table's row. Bounded by ``max_bytes`` (data + attributes + ids): the oldest appends go
first. Thread-safe (appends and rounds run on different threads).

Why (measured here, subscribe() at 500 msg/s with google-cloud-pubsub, load average ~7
on 2 cores): the payload read of a lease round took p50 ~35 ms of a ~115 ms round, and
the subscription's rounds ran back to back (~1.9 s of every 2 s), so every delivery
waited for it; a fresh message is nearly always one this server just committed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Sequence

import pyarrow as pa

PAYLOAD_COLUMNS = ["message_id", "data", "attributes", "ordering_key", "publish_time"]
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class PayloadCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes: must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # (topic_uid, message_id) -> ((its append's PAYLOAD_COLUMNS, its row there), bytes), in
        # insertion order. Rows stay Arrow until a round asks for them: turning every
        # published row into a dict at put (attributes as Python pairs) was ~20% of the event
        # loop's GIL time in bench/server.py's publish phase (py-spy), and most rows of a
        # publish-heavy server are never leased by this server.
        self._rows: OrderedDict[tuple[str, str], tuple[tuple[pa.Table, int], int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0  # rows served from memory (a test reads them)

    def put(self, rows: pa.Table) -> None:
        """Record committed messages-table rows (with ``topic_uid`` and PAYLOAD_COLUMNS)."""
        if self.max_bytes == 0 or rows.num_rows == 0:
            return
        topics = rows["topic_uid"].to_pylist()
        ids = rows["message_id"].to_pylist()
        sizes = rows["size_bytes"].to_pylist()  # data + attributes, as published
        table = rows.select(PAYLOAD_COLUMNS)
        with self._lock:
            for i, (topic, message_id, nbytes) in enumerate(zip(topics, ids, sizes)):
                size = (nbytes or 0) + 2 * len(message_id)
                key = (topic, message_id)
                old = self._rows.pop(key, None)
                if old is not None:
                    self._bytes -= old[1]
                self._rows[key] = ((table, i), size)
                self._bytes += size
            while self._bytes > self.max_bytes and self._rows:
                _, (_, size) = self._rows.popitem(last=False)
                self._bytes -= size

    def get(self, topic_uid: str, message_ids: Sequence[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """(cached rows by message id, the ids not cached, in the given order)."""
        found: dict[str, dict[str, Any]] = {}
        missing: list[str] = []
        by_table: dict[int, tuple[pa.Table, list[int]]] = {}
        with self._lock:
            for m in message_ids:
                hit = self._rows.get((topic_uid, m))
                if hit is None:
                    missing.append(m)
                else:
                    table, i = hit[0]
                    by_table.setdefault(id(table), (table, []))[1].append(i)
        for table, rows in by_table.values():  # one take and conversion per append
            for row in table.take(pa.array(rows, pa.int64())).to_pylist():
                found[row["message_id"]] = row
        with self._lock:
            self.hits += len(found)
        return found, missing

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)
