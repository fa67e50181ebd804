"""A full disk (issue 16, scenario 5): delta-rs's ENOSPC errors become ``StorageFull``, which
says "no space left on device", names the table's path and the fix; bench/chaos_storage.py
runs the real thing on a tmpfs."""

from __future__ import annotations

import errno

import pytest

from deltabus.errors import DeltabusError, StorageFull
from deltabus.server.status import status_of
from deltabus.storage.delta_rs import DeltaRsEngine

# What deltalake 1.6.6 raised on a full tmpfs (seen by bench/chaos_storage.py).
FROM_WRITE = OSError("Generic LocalFileSystem error\n  \x1b[31m↳\x1b[0m Unable to copy data to file\n"
                     "   \x1b[31m↳\x1b[0m No space left on device (os error 28)\n")
FROM_MERGE = Exception("Failed to parse parquet: External: Generic LocalFileSystem error: Unable to copy data to file: "
                       "No space left on device (os error 28)")


@pytest.mark.parametrize("exc", [FROM_WRITE, FROM_MERGE, OSError(errno.ENOSPC, "No space left on device")])
def test_full_disk_errors_are_recognised(exc):
    assert StorageFull.caused(exc)


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "Permission denied"), Exception("Failed to parse parquet: corrupt footer")])
def test_other_errors_are_not(exc):
    assert not StorageFull.caused(exc)


def test_the_message_names_the_problem_the_path_and_the_fix():
    e = StorageFull("append to messages", "/wh/messages")
    assert isinstance(e, DeltabusError) and isinstance(e, OSError) and e.errno == errno.ENOSPC
    assert str(e) == "append to messages: no space left on device at /wh/messages; free space on that filesystem, then retry"
    status = status_of(e)
    assert status.code.name == "UNAVAILABLE" and status.message == str(e)  # retryable, and says why


@pytest.mark.parametrize("raised", [FROM_WRITE, FROM_MERGE])
def test_a_transaction_that_finds_the_disk_full_raises_storage_full(tmp_path, raised):
    engine = DeltaRsEngine(str(tmp_path / "wh"))
    engine.ensure_tables()

    def fn(snap):
        raise raised

    with pytest.raises(StorageFull) as info:
        engine.transact("messages", fn, what="append to messages")
    assert str(info.value).startswith(f"append to messages: no space left on device at {tmp_path}/wh/messages;")
    assert info.value.__cause__ is raised


def test_other_errors_pass_through(tmp_path):
    engine = DeltaRsEngine(str(tmp_path / "wh"))
    engine.ensure_tables()

    def fn(snap):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        engine.transact("messages", fn, what="x")
