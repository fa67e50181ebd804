"""The idle push job's hint file (``policy.idle_wake``): written by the job's batch, read by
its stream source in the source's own Python process on every trigger.

Contract: ``write`` replaces the file atomically (a temporary file renamed over it), so a
reader sees the old hint or the new one, never part of one. ``read`` returns None for a
missing, unreadable or malformed file: the source then runs its batch, which is always safe
(the hint only ever saves work). ``clear`` removes it; the job clears it when it starts and
whenever a batch is not idle. The file names versions and times only: nothing of messages.
"""

from __future__ import annotations

import json
import os
import tempfile

from ..policy.idle_wake import WATCHED, IdleHint

FILE_NAME = "idle-hint.json"


def hint_path(checkpoint: str) -> str | None:
    """Where the job whose streaming checkpoint is `checkpoint` keeps its hint; None for a
    checkpoint in an object store (the hint is not kept there: every trigger runs a batch)."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return None
    return os.path.join(checkpoint.removeprefix("file://").removeprefix("file:"), FILE_NAME)


def write(path: str, hint: IdleHint) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = json.dumps({"versions": dict(hint.versions), "at": hint.at, "recheck": hint.recheck})
    fd, tmp = tempfile.mkstemp(prefix=".idle-hint-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read(path: str) -> IdleHint | None:
    try:
        with open(path) as f:
            raw = json.load(f)
        versions = {t: int(raw["versions"][t]) for t in WATCHED}
        return IdleHint(versions, float(raw["at"]), float(raw["recheck"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
