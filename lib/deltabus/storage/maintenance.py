"""Delta table maintenance for the embedded engine: compaction, checkpoints, vacuum.

Why it matters (measured here with deltalake 1.6.6): every live file costs every later
commit something, so an append to a table of 1,000-row files went from 12 ms at 100
files to 43 ms at 400; one compaction brought it back to 16 ms. Publishing appends one
file per batch, and each MERGE on ``deliveries`` leaves small files behind, so without
compaction the cost of a message grows with the history of the table.

- **Auto-compaction** (``AutoCompact``): after every ``every`` commits to a table, the
  partition just written is compacted if it holds at least ``min_files`` files. It runs
  in the writer that crossed the boundary, like Delta's ``autoCompact``. Compaction
  commits change no data (``dataChange=false``), so the change feed, and with it
  fan-out, never sees their rows again; the removed files stay on disk for readers of
  older versions until ``vacuum``.
- **Checkpoints**: delta-rs writes one every ``delta.checkpointInterval`` (100) commits.
- **Vacuum** (``vacuum``): deletes files no version within the retention needs (7 days
  by default, the log's own retention, so cursors within it can still read the feed).
  How much longer a table's history must stay is the caller's to say (``keep_hours``):
  storage knows nothing of subscriptions. ``deltabus.retention`` works it out for the
  messages table from the subscriptions' fan-out cursors and calls ``maintain_warehouse``.
- **Purge**: an ack deletes its ``deliveries`` row in the same MERGE, so acked rows never
  linger; vacuum then frees their files.
- **Log cleanup** (``LogCleanup``, ``expired_log_files``): delta-rs lists ``_delta_log`` on
  every commit and refresh, and on a local disk that costs per file: a one-row append took
  9.8 ms of CPU with 123 log files, 22 ms with 2,052 and 40 ms with 4,082 (flat at ~6-7 ms
  with the log cleaned; tombstones did not matter). Delta keeps commit files for 30 days,
  so a table taking 20 commits a second slowed by the hour. A table whose spec says how
  much log history its readers need (``TableSpec.log_keep_seconds``) has the log files
  older than that AND before its newest checkpoint at least that old deleted every
  ``LogCleanup.every`` commits. The checkpoint holds the state, application transactions included; a reader or
  writer holding a snapshot older than the kept history must start again from a fresh one.
- **delta-rs's own expired-log cleanup** (a post-commit hook, on for every table by default:
  it deletes log files older than ``delta.logRetentionDuration``, 30 days) lists the whole
  ``_delta_log`` after EVERY commit, to find the few files that aged past the retention
  since the last look (it keeps everything from the newest checkpoint at or before the
  oldest version still within the retention). Measured here (deltalake 1.6.6, one-row appends with a compaction every 20):
  12 ms an append at 1,000 log files, 27 ms at 3,000; with the hook asked to skip, 7.8 and
  10.5 ms. The messages table is never cleaned by ``LogCleanup`` (the change feed is its
  readers' input), so every publish paid it, growing by the hour. So every commit tells the
  hook to skip (``expired_log_cleanup``) except one in ``EXPIRED_LOG_CLEANUP_EVERY``
  versions, which leaves it to the table's own setting (never forces it on: a table with
  ``delta.enableExpiredLogCleanup=false`` stays uncleaned): the log is still cleaned as Delta
  says, about 100 versions later at most (up to ~200 when concurrent writers' version races
  skip a turn). Compaction commits skip it too; the rare ones (migrations, a claim of an
  export table, ``maintain_warehouse``) leave the hook as it is.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import PostCommitHookProperties

    from .tables import TableSpec

log = logging.getLogger(__name__)

DEFAULT_RETENTION_HOURS = 168

# One commit in this many versions lets delta-rs's expired-log hook run (the module docstring).
# Which one does not matter (files age with time, not with checkpoints): the one that writes a
# checkpoint under delta-rs's default interval of 100.
EXPIRED_LOG_CLEANUP_EVERY = 100


def expired_log_cleanup(next_version: int, every: int = EXPIRED_LOG_CLEANUP_EVERY) -> bool | None:
    """What a commit expected to write `next_version` tells delta-rs's expired-log hook
    (``PostCommitHookProperties.cleanup_expired_logs``): None, the table's own setting, on
    one version in `every` (99, 199, ...: with an interval of 100, deltalake 1.6.6 writes
    its checkpoints on those), False (skip) on the others. A commit that loses a version
    race lands elsewhere: a cleanup skipped so is made by a later one. Pure."""
    if every < 1:
        raise ValueError(f"every: must be >= 1, got {every}")
    return None if (next_version + 1) % every == 0 else False


def post_commit_hooks(current_version: int) -> "PostCommitHookProperties":
    """delta-rs's ``PostCommitHookProperties`` for a commit on a table now at
    `current_version`: checkpoints as the table says, the expired-log cleanup only when
    ``expired_log_cleanup`` lets it. For every delta-rs commit of a table that takes many."""
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=expired_log_cleanup(current_version + 1))


@dataclass(frozen=True, slots=True)
class AutoCompact:
    every: int = 50  # commits between checks of one table
    min_files: int = 32  # a partition with fewer files is left alone
    target_size: int | None = None  # bytes; None = the table's delta.targetFileSize or delta-rs's default

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("AutoCompact.every must be >= 1")
        if self.min_files < 2:
            raise ValueError("AutoCompact.min_files must be >= 2")

    def due(self, version: int) -> bool:
        return version > 0 and version % self.every == 0


def file_count(dt: Any, partition_column: str | None, partition: str | None) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(dt.get_add_actions(flatten=True))
    if partition_column is None or partition is None or actions.num_rows == 0:
        return int(actions.num_rows)
    return int(pc.sum(pc.equal(actions[f"partition.{partition_column}"], partition)).as_py() or 0)


def compact(
    dt: Any, partition_column: str | None, partition: str | None, *, target_size: int | None = None, row_group_rows: int | None = None,
) -> Mapping[str, Any]:
    """Rewrite the small files of one partition (or the table) into large ones; no data
    change. `target_size` bytes a file (None: the table's ``delta.targetFileSize`` or
    delta-rs's default), row groups of at most `row_group_rows` rows (None: delta-rs's)."""
    from deltalake import WriterProperties

    filters = [(partition_column, "=", partition)] if partition_column and partition is not None else None
    # Compressed as delta-rs's own compaction does (ZSTD): WriterProperties() alone writes
    # uncompressed files (measured: 16,384 short messages took 819 KB so, 79 KB in ZSTD).
    writer = None if row_group_rows is None else WriterProperties(max_row_group_size=row_group_rows, compression="ZSTD")
    result: Mapping[str, Any] = dt.optimize.compact(partition_filters=filters, target_size=target_size, writer_properties=writer,
                                                    post_commithook_properties=post_commit_hooks(dt.version()))
    return result


def compact_table(dt: Any, spec: "TableSpec", partition: str | None, *, target_size: int | None = None) -> Mapping[str, Any]:
    """``compact`` one partition of a deltabus table, laid out as its spec says
    (``TableSpec.layout``); `target_size`, when given, overrides the layout's."""
    layout = spec.layout
    size = target_size if target_size is not None else (None if layout is None else layout.target_size)
    return compact(dt, spec.partition_column, partition, target_size=size, row_group_rows=None if layout is None else layout.row_group_rows)


def vacuum(dt: Any, retention_hours: int = DEFAULT_RETENTION_HOURS) -> list[str]:
    """Delete files that no version within `retention_hours` refers to; return their paths."""
    if retention_hours < 0:
        raise ValueError("retention_hours must be >= 0")
    removed: list[str] = dt.vacuum(retention_hours=retention_hours, enforce_retention_duration=False, dry_run=False)
    return removed


def maintain_warehouse(
    warehouse: str,
    *,
    retention_hours: int = DEFAULT_RETENTION_HOURS,
    min_files: int = 2,
    keep_hours: Mapping[str, int],
) -> list[dict[str, Any]]:
    """Compact every partition of every table holding at least `min_files` files, write a
    checkpoint, and vacuum files older than `retention_hours` that no version needs.

    `keep_hours` maps a table name to the hours of history its readers still need; vacuum
    keeps the larger of that and `retention_hours`. It is required (``{}`` says "none"), so
    no caller forgets the fan-out cursors: use ``deltabus.retention.maintain``.

    Safe while publishers, pullers and the push job run: compaction changes no data and a
    conflicting compaction is skipped (the next run retries it)."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    from ..errors import InvalidArgument, StorageFull
    from .log_repair import open_table
    from .tables import ALL

    if retention_hours < 0:
        raise InvalidArgument("retention_hours", f"must be >= 0, got {retention_hours}")
    if "://" not in warehouse:
        import os

        warehouse = os.path.abspath(warehouse)
    report = []
    for spec in ALL:
        uri = f"{warehouse.rstrip('/')}/{spec.name}"
        if not DeltaTable.is_deltatable(uri):
            continue
        try:
            dt = open_table(uri)
            col = spec.partition_column
            actions = pa.table(dt.get_add_actions(flatten=True))
            before = actions.num_rows
            # Files per partition, counted once from the log (compacting one partition leaves the others' counts).
            counts: dict[str | None, int] = {None: before}
            if col is not None and before:
                grouped = actions.group_by(f"partition.{col}").aggregate([("path", "count")])
                counts = dict(zip(grouped[f"partition.{col}"].to_pylist(), grouped["path_count"].to_pylist()))
            skipped = 0
            for part, files in counts.items():
                if files < min_files or (col is not None and part is None):
                    continue
                try:
                    compact_table(dt, spec, part)
                except CommitFailedError:
                    skipped += 1
                dt.update_incremental()
            dt.create_checkpoint()
            removed = vacuum(dt, max(retention_hours, keep_hours.get(spec.name, 0)))
            report.append({"table": spec.name, "files_before": before, "files_after": file_count(dt, None, None),
                           "vacuumed": len(removed), "compactions_skipped": skipped, "version": dt.version()})
        except Exception as exc:  # a full disk: name the table and the fix, not a DeltaError's traceback
            if not StorageFull.caused(exc):
                raise
            raise StorageFull(f"maintenance of {spec.name}", uri) from exc
    return report


def first_commit_since(table_uri: str, version: int, storage_options: Mapping[str, str] | None = None) -> float | None:
    """The time (seconds since the epoch) of the earliest commit at or after `version` of the
    table, from its log's history; None when there is none (`version` is past the end)."""
    from .log_repair import open_table

    dt = open_table(table_uri, storage_options)
    if version > dt.version():
        return None
    stamps = [h["timestamp"] for h in dt.history() if h.get("version", -1) >= version and "timestamp" in h]
    return min(stamps) / 1000.0 if stamps else None


# Commit files, their checksums, checkpoints (single, multi-part, v2) and log compactions:
# the version (the end version for a compaction) is what decides.
_LOG_FILE = re.compile(r"^(\d{20})(?:\.(\d{20}))?\.(json|crc|checkpoint(?:\.[^/]*)?\.parquet|compacted\.json)$")


@dataclass(frozen=True, slots=True)
class LogCleanup:
    """How often the embedded engine cleans a table's log (see the module docstring)."""

    every: int = 100  # commits between cleanups of one table (delta-rs checkpoints every 100)

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("LogCleanup.every must be >= 1")

    def due(self, version: int) -> bool:
        # Halfway between checkpoints (written at versions 99, 199, ...): never racing one.
        return version > 0 and version % self.every == self.every // 2


def expired_log_files(files: Sequence[tuple[str, float]], now: float, keep_seconds: float) -> list[str]:
    """The names among `files` ((name, modification time)) of a ``_delta_log`` that may go:
    log files modified more than `keep_seconds` before `now`, of versions before the newest
    checkpoint that is itself that old (so a reader that listed the log just before a new
    checkpoint appeared still finds what it listed, as Delta's own cleanup does).
    ``_last_checkpoint`` and anything unknown stay. Pure."""
    parsed = []
    for name, mtime in files:
        m = _LOG_FILE.match(name)
        if m is not None:
            parsed.append((name, mtime, int(m.group(2) or m.group(1)), m.group(3).startswith("checkpoint")))
    old_checkpoints = [version for _, mtime, version, is_checkpoint in parsed if is_checkpoint and now - mtime > keep_seconds]
    if not old_checkpoints:
        return []
    horizon = max(old_checkpoints)
    return [name for name, mtime, version, _ in parsed if version < horizon and now - mtime > keep_seconds]


def clean_log(table_path: str, now: float, keep_seconds: float) -> int:
    """Delete the expired files of a local table's ``_delta_log`` (``expired_log_files``);
    return how many. Without a checkpoint old enough, nothing goes. Local paths only."""
    log_dir = os.path.join(table_path, "_delta_log")
    try:
        entries = []
        with os.scandir(log_dir) as it:
            for e in it:
                if e.is_file():
                    entries.append((e.name, e.stat().st_mtime))
    except OSError:
        return 0
    removed = 0
    for name in expired_log_files(entries, now, keep_seconds):
        try:
            os.remove(os.path.join(log_dir, name))
            removed += 1
        except FileNotFoundError:  # another writer's cleanup got it first
            pass
    return removed
