"""The messages-table versions this server committed itself, with their rows' fan-out columns.

Contract: ``put(version, rows)`` records a messages-table version the Publish group
commit wrote (``publish_commit``; `rows` its appended rows, MESSAGES columns), right after
the commit. ``fanout(topic_uid, first, last, attributes)`` returns the messages of a topic
appended in versions first..last as ``delivery.cursor.read_unfanned`` would read them from
the change feed (FANOUT_COLUMNS, ``message_version`` the version, plus ``attributes`` when
asked), reading the change feed only for the versions of that range it did not record
(another writer's appends, a compaction or a retention delete, which add no messages),
each run of them in one read. ``own(first, last)``: whether this server wrote every version
of first..last (the log watcher needs to wake nobody for them: ``published`` already did).
Bounded to the newest ``max_versions`` versions. Thread-safe (the publish thread writes,
the rounds' threads read).

A version's rows never change once committed, so a recorded version is exactly what the
change feed holds for it: only inserts, all of them.

Why (measured here, ``bench/server.py`` latency phase at 500 msg/s): see
``StreamHub``'s use in ``group_commit.fan_out``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

from ..delivery.cursor import FANOUT_COLUMNS, empty_fanout
from ..storage.tables import MESSAGES

DEFAULT_MAX_VERSIONS = 4096
_KEPT = ["topic_uid", "message_id", "publish_time", "ordering_key", "size_bytes", "attributes"]

# (first, last) -> the change feed's rows of those versions for one topic (read_unfanned)
ChangeFeed = Callable[[int, int], pa.Table]


class OwnCommits:
    def __init__(self, max_versions: int = DEFAULT_MAX_VERSIONS) -> None:
        if max_versions < 1:
            raise ValueError(f"max_versions: must be >= 1, got {max_versions}")
        self.max_versions = max_versions
        self._lock = threading.Lock()
        self._versions: OrderedDict[int, dict[str, pa.Table]] = OrderedDict()  # version -> topic_uid -> rows
        self.hits = 0  # versions served from memory (a test reads them)
        self.misses = 0  # versions read from the change feed

    def put(self, version: int, rows: pa.Table) -> None:
        """Record the rows (MESSAGES columns) the commit of `version` appended."""
        kept = rows.select(_KEPT)
        topics = kept["topic_uid"]
        uids = pc.unique(topics).to_pylist()
        if len(uids) == 1:
            by_topic = {uids[0]: kept.drop_columns(["topic_uid"])}
        else:
            by_topic = {u: kept.filter(pc.equal(topics, u)).drop_columns(["topic_uid"]) for u in uids}
        with self._lock:
            self._versions[version] = by_topic
            while len(self._versions) > self.max_versions:
                self._versions.popitem(last=False)

    def own(self, first: int, last: int) -> bool:
        """Whether every version of first..last was recorded here (an empty range: True)."""
        with self._lock:
            return all(v in self._versions for v in range(first, last + 1))

    def fanout(self, topic_uid: str, first: int, last: int, attributes: bool, change_feed: ChangeFeed) -> pa.Table:
        """The topic's messages appended in versions first..last (see the module docstring);
        `change_feed(a, b)` reads versions a..b the slow way."""
        parts: list[pa.Table] = []
        with self._lock:
            known = {v: self._versions.get(v) for v in range(first, last + 1)}
        run: int | None = None  # first version of the current run of unrecorded versions
        for v in range(first, last + 2):
            rec = known.get(v) if v <= last else None
            if v <= last and rec is None:
                run = v if run is None else run
                continue
            if run is not None:
                parts.append(change_feed(run, v - 1))
                self.misses += v - run
                run = None
            if rec is None:
                continue
            self.hits += 1
            rows = rec.get(topic_uid)
            if rows is not None and rows.num_rows:
                parts.append(_as_fanout(rows, v, attributes))
        schema = fanout_schema(attributes)
        if not parts:
            return schema.empty_table()
        parts = [p if p.schema.equals(schema) else p.cast(schema) for p in parts]
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def fanout_schema(attributes: bool) -> pa.Schema:
    """The schema ``read_unfanned`` returns (with ``attributes`` last when asked)."""
    schema = empty_fanout().schema
    return schema.append(MESSAGES.schema.field("attributes")) if attributes else schema


def _as_fanout(rows: pa.Table, version: int, attributes: bool) -> pa.Table:
    """Recorded rows as ``read_unfanned`` returns them: FANOUT_COLUMNS (+ attributes)."""
    out = rows.append_column("message_version", pa.repeat(pa.scalar(version, pa.int64()), rows.num_rows))
    return out.select([*FANOUT_COLUMNS, *(["attributes"] if attributes else [])])
