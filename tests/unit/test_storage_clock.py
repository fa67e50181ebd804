"""storage/clock.py StorageClock recovering (injected clocks, a temporary folder): a refusal
probes once first; a failed probe backs off; a step back mid-observation restarts; a
read-only warehouse folder falls back to the deliveries table's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltabus.errors import ClockUncertain
from deltabus.policy.clock_skew import ClockSkewPolicy
from deltabus.storage.clock import StorageClock
from tests.conftest import ManualClock

POLICY = ClockSkewPolicy(drift=0.01, refresh_seconds=100.0, max_uncertainty=0.5)


class _Engine:
    def __init__(self, warehouse: str, deliveries: str | None = None) -> None:
        self.warehouse = warehouse
        self._deliveries = deliveries or os.path.join(warehouse, "deliveries")
        self.observers: list[object] = []

    def table_uri(self, table: str) -> str:
        return self._deliveries

    def observe_commits(self, observer: object) -> None:
        self.observers.append(observer)


def _clock(local: ManualClock, folder: Path, deliveries: Path | None = None) -> StorageClock:
    storage = StorageClock(local, POLICY, monotonic=lambda: local() - 5_000.0)  # no step: they move together
    storage.attach(_Engine(str(folder), None if deliveries is None else str(deliveries)))  # type: ignore[arg-type]
    return storage


def test_an_idle_clock_whose_estimate_drifted_too_wide_probes_once_before_refusing(tmp_path: Path) -> None:
    local = ManualClock(1_000_000.0)
    storage = _clock(local, tmp_path)
    storage.latest()
    assert storage.probes == 1
    local.advance(60.0)  # idle: drift alone widens the estimate by 2 x 0.6 s, still within refresh_seconds
    storage.latest()  # refused before: nothing re-read the storage, forever
    assert storage.probes == 2 and storage.describe()["width"] <= POLICY.max_uncertainty


def test_a_refusal_names_the_failed_probe(tmp_path: Path) -> None:
    local = ManualClock(1_000_000.0)
    missing = tmp_path / "missing"
    storage = _clock(local, missing)
    storage.committed(local() - 1.0, local(), int(local() * 1e9))  # an estimate ±0.5 s: too wide
    with pytest.raises(ClockUncertain, match="the last probe of the storage failed: cannot write a probe in"):
        storage.latest()


def test_a_failed_probe_is_not_retried_on_every_call(tmp_path: Path) -> None:
    local = ManualClock(1_000_000.0)
    missing = tmp_path / "missing"
    storage = _clock(local, missing)
    storage()  # probes, fails
    missing.mkdir()
    local.advance(50.0)
    storage()
    assert storage.probes == 0  # within refresh_seconds of the failure: not tried again
    local.advance(51.0)
    storage()
    assert storage.probes == 1


def test_a_step_back_between_an_observation_s_readings_restarts_the_estimate(tmp_path: Path) -> None:
    local = ManualClock(1_000_000.0)
    storage = _clock(local, tmp_path)
    storage.latest()
    storage.committed(local(), local() - 3.0, int(local() * 1e9))  # raised ValueError out of the commit's report
    assert storage.restarts == 1 and storage.describe()["available"] is False
    storage.latest()  # the next call observes again
    assert storage.describe()["available"] is True


def test_a_warehouse_folder_that_cannot_be_written_falls_back_to_the_deliveries_table_s(tmp_path: Path) -> None:
    local = ManualClock(1_000_000.0)
    table = tmp_path / "deliveries"
    table.mkdir()
    storage = _clock(local, tmp_path / "missing", table)
    storage.latest()
    assert storage.probes == 1 and storage.describe()["available"] is True


def test_clocks_gone_are_no_longer_told_of_an_engine_s_commits(tmp_path: Path) -> None:
    """Every client made over one engine attaches its clock: one gone must cost the engine's
    commits nothing (they were kept forever), and an engine gone is no longer attached."""
    import gc

    from deltabus.storage import open_engine

    engine = open_engine(str(tmp_path / "warehouse"), engine="delta-rs")
    for _ in range(3):
        StorageClock().attach(engine)
    kept = StorageClock()
    kept.attach(engine)
    kept.attach(engine)
    gc.collect()
    assert engine.snapshot("deliveries")._observers == (kept,)  # type: ignore[attr-defined]
    other = open_engine(str(tmp_path / "warehouse"), engine="delta-rs")
    kept.attach(other)
    del other
    gc.collect()
    assert len(kept._engines) == 1
