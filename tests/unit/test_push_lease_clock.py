"""The push job hands its workers lease ends on its own host's clock: the leases are written
in storage time (storage/clock.py), and the workers and the ledger judge them with their
own clocks (push/worker.py, push/ledger.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from deltabus.policy.clock_skew import ClockSkewPolicy
from deltabus.push.job import DeliveryJob
from deltabus.storage.clock import StorageClock, local_deadline
from tests.conftest import ManualClock


def _ahead(local: ManualClock) -> StorageClock:
    """A StorageClock whose storage is 30 s ahead of `local`: offset in [29.995, 30.025]."""
    storage = StorageClock(local, ClockSkewPolicy(granularity=0.02, drift=0.0), monotonic=lambda: local() - 5_000.0)
    storage.committed(local(), local() + 0.01, int((local() + 30.005) * 1e9))
    return storage


def test_a_lease_end_in_storage_time_becomes_no_later_local_time() -> None:
    local = ManualClock(1_000.0)
    storage = _ahead(local)
    assert local_deadline(storage, 1_040.0) == pytest.approx(1_040.0 - 30.025)
    assert local_deadline(local, 1_040.0) == 1_040.0  # a plain clock: as is


def test_the_job_hands_the_workers_lease_ends_on_its_own_clock() -> None:
    local = ManualClock(1_000.0)
    built: list[Any] = []
    job = SimpleNamespace(
        _clock=_ahead(local),
        requests=SimpleNamespace(build=lambda rec, items, at, ends: built.append(ends) or pa.table({"message_id": ["m"]})),
        book=SimpleNamespace(pushed=lambda *a: None),
        _start_pool=lambda: SimpleNamespace(submit=lambda *a: None),
    )
    assert DeliveryJob._launch(job, {"u": object()}, {"u": [("m", 1)]}, 1_030.0, {"u": 1_040.0}) == 1  # type: ignore[arg-type]
    # A worker on this host judges it with time.time: expired when the storage's 1,040 may have come.
    assert built == [pytest.approx(1_040.0 - 30.025)]


def test_push_tokens_are_stamped_with_this_host_s_clock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A token's iat/exp come from the local clock (storage.clock.wall), not the storage's
    earliest possible time."""
    from deltabus import config
    from deltabus.storage import open_engine

    local = ManualClock(1_000.0)
    engine = open_engine(str(tmp_path / "warehouse"), engine="delta-rs")
    settings = config.Settings(warehouse=str(tmp_path / "warehouse"), allow_http=True, engine="delta-rs")
    job = DeliveryJob(None, settings, engine=engine, clock=local, clock_skew=ClockSkewPolicy())  # type: ignore[arg-type]
    assert isinstance(job._clock, StorageClock) and job._clock() != local()  # the storage is ~56 years ahead
    assert job.requests._clock() == local()
