"""How much a lagging push subscription fans out per batch: pure policy (push/plan.py)."""

from __future__ import annotations

from dataclasses import replace

import pyarrow.compute as pc

from deltabus.delivery.hooks import DEFAULT_HOOKS
from deltabus.policy.lease_start import FANOUT_LIMIT
from deltabus.delivery.fanout import CATCH_UP_MIN, CATCH_UP_ROOMS, catch_up_rows
from deltabus.push.plan import catch_up_limit


def test_catch_up_follows_the_window_room_within_bounds() -> None:
    assert catch_up_limit(0, DEFAULT_HOOKS) == CATCH_UP_MIN  # a full window (or backoff) still moves the cursor on
    assert catch_up_limit(1, DEFAULT_HOOKS) == CATCH_UP_MIN
    assert catch_up_limit(1_000, DEFAULT_HOOKS) == max(CATCH_UP_MIN, CATCH_UP_ROOMS * 1_000)
    # never past the rows above which a batch grants no leases (policy/lease_start.py)
    assert catch_up_limit(100_000, DEFAULT_HOOKS) == FANOUT_LIMIT


def test_ordering_keys_catch_up_unbounded() -> None:
    ordered = replace(DEFAULT_HOOKS, eligible=lambda rows: pc.is_valid(rows["message_id"]))
    assert catch_up_limit(0, ordered) is None
    assert catch_up_limit(10, ordered) is None


def test_pull_catch_up_follows_what_it_may_lease() -> None:
    assert catch_up_rows(0, False) == CATCH_UP_MIN
    assert catch_up_rows(10, False) == CATCH_UP_MIN
    assert catch_up_rows(100_000, False) == CATCH_UP_ROOMS * 100_000  # no cap: the caller asked for that many
    assert catch_up_rows(100_000, False, 5_000) == 5_000
    assert catch_up_rows(10, True) is None
    assert catch_up_rows(10, False, floor=20_000) == 20_000  # pulls and server rounds: a larger floor
