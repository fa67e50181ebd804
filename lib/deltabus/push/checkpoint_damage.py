"""A damaged streaming checkpoint of the push job: told apart from other query failures, and set aside.

Contract.

- ``damage(message, checkpoint)`` (pure) is the one-line reason when a streaming query's
  failure `message` says it could not read a file of the job's own `checkpoint` (a
  truncated, cut or garbled offsets or commits log file, as a crash of the storage under a
  write, or a hand edit, leaves it), else None. A damaged ``metadata`` file is not among
  them: Spark reads it inside ``start()``, which then fails with a traceback (nothing is
  lost; delete the checkpoint and start again).
- ``set_aside(checkpoint, stamp)`` renames a checkpoint on a local file system to
  ``<checkpoint>.damaged-<stamp>`` and returns the new path (None for one on another
  store: nothing is moved there).

Why it is safe to start again without the checkpoint: the push job's fan-out follows each
subscription's cursor in the ``deliveries`` table, not the stream's offsets, which only
pace the batches; and a new checkpoint's batches are recorded under an application id of
their own (``micro_batch.app_id_for`` with the new query's id), so none is taken for a
replay. Nothing is lost or pushed twice on purpose. Measured before (chaos suite,
damaged-state scenario): a truncated ``offsets/N`` stopped every later start of the job
with "Failed to read log file ... Incomplete log file" and a traceback, a halved
``commits/N`` with "Checksum error: file:.../commits/N".
"""

from __future__ import annotations

import os

# What Spark's checkpoint logs say when a file of theirs cannot be read (Spark 4.1).
SIGNS = (
    "Incomplete log file",
    "Failed to read log file",
    "Log file was malformed",
    "malformed",
    "Unexpected end-of-input",
    "JsonParseException",
    "MismatchedInputException",
    "Unrecognized token",
    "EOFException",
    "Checksum error",  # Hadoop's .crc beside a log file that was cut (seen: a halved commits/N)
    "ChecksumException",
)


def _local(path: str) -> str | None:
    if path.startswith("file:"):
        return path.removeprefix("file://").removeprefix("file:")
    return None if "://" in path else path


def damage(message: str, checkpoint: str) -> str | None:
    """The reason (one line) when a line of `message` names a file inside `checkpoint` (its
    path and a slash: ``.../deliver`` is not ``.../deliver-delta-spark``) together with one
    of SIGNS, else None."""
    inside = (_local(checkpoint) or checkpoint).rstrip("/") + "/"
    for line in message.splitlines():
        if inside in line and any(sign in line for sign in SIGNS):
            return line.strip()[:300]
    return None


def set_aside(checkpoint: str, stamp: str) -> str | None:
    """Move a local `checkpoint` to ``<checkpoint>.damaged-<stamp>``; None when it is not local."""
    path = _local(checkpoint)
    if path is None:
        return None
    path = path.rstrip("/")
    target, n = f"{path}.damaged-{stamp}", 1
    while os.path.exists(target):  # set aside twice within the stamp's second
        n += 1
        target = f"{path}.damaged-{stamp}-{n}"
    os.rename(path, target)
    return target
