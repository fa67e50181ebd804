"""How far back vacuum must keep the messages table's history, and warehouse maintenance
with that limit.

Fan-out reads the messages table's change feed from each subscription's cursor
(``delivery.cursor``), which needs the data files of every version after the oldest
cursor: vacuum must not delete them. Storage (``storage.maintenance``) compacts,
checkpoints and vacuums without knowing of subscriptions; this module, above it, reads the
cursors through the ``Engine`` and tells it how many hours to keep.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .delivery.cursor import cursor_app_id
from .storage import Engine
from .storage.maintenance import DEFAULT_RETENTION_HOURS, first_commit_since, maintain_warehouse
from .storage.tables import DELIVERIES, MESSAGES, SUBSCRIPTIONS


def oldest_unfanned_version(engine: Engine) -> int | None:
    """The first messages version some subscription has not fanned out yet (its cursor + 1),
    the lowest over all subscriptions; None when there are no subscriptions."""
    subs = engine.snapshot(SUBSCRIPTIONS.name).read(columns=["sub_uid", "start_version"]).to_pylist()
    if not subs:
        return None
    deliveries = engine.snapshot(DELIVERIES.name)
    cursors = []
    for row in subs:
        cursor = deliveries.txn_version(cursor_app_id(row["sub_uid"]))
        cursors.append(row["start_version"] if cursor is None else cursor)
    return min(cursors) + 1


def hours_to_keep(first_unfanned_commit: float | None, now: float) -> int:
    """Whole hours of history to keep so that a commit made at `first_unfanned_commit`
    (seconds since the epoch) survives vacuum at `now`: its age rounded up, plus one hour
    of margin for the time between this reading and the vacuum. 0 when nothing is unfanned."""
    if first_unfanned_commit is None:
        return 0
    age_hours = max(0.0, now - first_unfanned_commit) / 3600.0
    return int(math.ceil(age_hours)) + 1


def hours_to_keep_for_fan_out(engine: Engine, now: float) -> int:
    """Hours of messages history that subscriptions still have to fan out (0: none)."""
    oldest = oldest_unfanned_version(engine)
    if oldest is None:
        return 0
    return hours_to_keep(first_commit_since(engine.table_uri(MESSAGES.name), oldest), now)


def maintain(
    engine: Engine,
    *,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    min_files: int = 2,
    clock: Callable[[], float],
) -> list[dict[str, Any]]:
    """``storage.maintenance.maintain_warehouse`` of the engine's warehouse, keeping the
    messages history every subscription's fan-out still needs.

    The cursors are read before compacting: a cursor only moves forward, so a limit read
    earlier keeps at least as much as one read just before the vacuum would."""
    keep = {MESSAGES.name: hours_to_keep_for_fan_out(engine, clock())}
    return maintain_warehouse(engine.warehouse, retention_hours=retention_hours, min_files=min_files, keep_hours=keep)
