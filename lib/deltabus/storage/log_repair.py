"""Opening a Delta table whose ``_delta_log/_last_checkpoint`` hint names a checkpoint that is gone.

Contract: ``open_table(uri, storage_options)`` is ``deltalake.DeltaTable(uri, ...)``, except
when the table's ``_last_checkpoint`` names a checkpoint file that no longer exists (a
removed or lost ``*.checkpoint.parquet``). delta-rs then refuses the table outright
("Invalid Checkpoint: Had a _last_checkpoint hint but didn't find any checkpoints"), and
every client, the server and the push job stopped with a traceback (the chaos suite's
damaged-state scenario). The hint is optional in the Delta protocol: a reader without one
lists the log and starts from the latest checkpoint it finds (or version 0). So on a local
file system the stale hint is deleted (one warning line naming it) and the table opened
again: what the reader sees is exactly the table's log, nothing is guessed. When the log
cannot be read without that checkpoint either (the commits before it were cleaned up),
``FailedPrecondition`` says which file is missing and to restore it from a backup. On an
object store nothing is deleted: ``FailedPrecondition`` names the hint to delete.

Another process repairing the same table at once is harmless (the hint is gone either way).
``drop_stale_hint(uri)`` is the repair alone, for a reader that hit the error on a table it
already had open (the delta-rs engine's ``transact`` reruns its work after it, once).
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Mapping

from ..errors import FailedPrecondition
from .clock import local_folder

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

MISSING_HINTED = "Had a _last_checkpoint hint but didn't find any checkpoints"


def _hinted_version(hint: str) -> str:
    try:
        with open(hint) as f:
            return str(json.loads(f.readline()).get("version", "?"))
    except (OSError, ValueError, AttributeError):
        return "?"


def drop_stale_hint(uri: str) -> bool:
    """Delete the table's ``_last_checkpoint`` when no checkpoint file of the version it names
    exists (local file systems only); True when one was deleted. Any other error a reader
    raises is not this module's to mend."""
    folder = local_folder(uri)
    if folder is None:
        return False
    log_dir = os.path.join(folder, "_delta_log")
    hint = os.path.join(log_dir, "_last_checkpoint")
    version = _hinted_version(hint)
    if not version.isdigit():
        return False
    prefix = f"{int(version):020d}.checkpoint."
    try:
        if any(name.startswith(prefix) for name in os.listdir(log_dir)):
            return False
        os.remove(hint)
    except FileNotFoundError:
        return False  # another process removed it first
    log.warning("%s: _delta_log/_last_checkpoint named checkpoint version %s, whose file is missing; "
                "removed the hint, the table is read from its log", uri, version)
    return True


def open_table(uri: str, storage_options: Mapping[str, str] | None = None) -> "DeltaTable":
    """The table at `uri` (see the module docstring)."""
    from deltalake import DeltaTable

    options = dict(storage_options) if storage_options else None
    try:
        return DeltaTable(uri, storage_options=options)
    except Exception as exc:  # deltalake's DeltaError
        if MISSING_HINTED not in str(exc):
            raise
        folder = local_folder(uri)
        hint_uri = f"{uri.rstrip('/')}/_delta_log/_last_checkpoint"
        if folder is None:
            raise FailedPrecondition(
                f"{uri}: _delta_log/_last_checkpoint names a checkpoint file that is missing; "
                f"delete {hint_uri} (the log is then read without it) or restore the checkpoint file"
            ) from exc
        version = _hinted_version(os.path.join(folder, "_delta_log", "_last_checkpoint"))
        drop_stale_hint(uri)
    try:
        return DeltaTable(uri, storage_options=options)
    except Exception as again:
        raise FailedPrecondition(
            f"{uri}: its _delta_log checkpoint at version {version} is missing and the log cannot be read without it "
            f"({str(again).splitlines()[0] if str(again) else type(again).__name__}); restore that checkpoint file from a backup"
        ) from again
