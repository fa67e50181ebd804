"""storage/arrow.py: which row groups a lookup by key range reads, and the file layout's rules."""

from __future__ import annotations

import pytest

from deltabus.storage.arrow import row_groups_within
from deltabus.storage.tables import MESSAGES, FileLayout


def _stats(*ranges):
    return [None if r is None else {"min": r[0], "max": r[1]} for r in ranges]


def test_only_row_groups_overlapping_the_range_are_kept():
    stats = _stats(("a", "c"), ("d", "f"), ("g", "i"), ("j", "l"))
    assert row_groups_within(stats, "e", "h") == [1, 2]
    assert row_groups_within(stats, "a", "a") == [0]
    assert row_groups_within(stats, "l", "z") == [3]
    assert row_groups_within(stats, "m", "z") == []
    assert row_groups_within(stats, "0", "9") == []


def test_bounds_are_inclusive_on_both_sides():
    stats = _stats(("b", "d"))
    assert row_groups_within(stats, "d", "e") == [0]
    assert row_groups_within(stats, "a", "b") == [0]
    assert row_groups_within(stats, "d\x00", "e") == []


def test_row_groups_without_statistics_are_always_read():
    stats = [None, {"min": "a"}, {"max": "z"}, {}, {"min": None, "max": None}, {"min": "x", "max": "y"}]
    assert row_groups_within(stats, "b", "c") == [0, 1, 2, 3, 4]


def test_interleaved_row_groups_are_kept_when_they_span_the_range():
    # A compaction that folded new files into an old one writes row groups spanning both.
    stats = _stats(("a", "z"), ("m", "n"), ("b", "c"))
    assert row_groups_within(stats, "d", "e") == [0]


def test_file_layout_refuses_empty_sizes_naming_the_field():
    with pytest.raises(ValueError, match="target_size"):
        FileLayout(target_size=0, row_group_rows=10)
    with pytest.raises(ValueError, match="row_group_rows"):
        FileLayout(target_size=10, row_group_rows=0)


def test_the_messages_table_is_laid_out_for_lookups_by_id():
    assert MESSAGES.layout is not None
    assert MESSAGES.layout.target_size <= 16 * 1024 * 1024
    assert MESSAGES.layout.row_group_rows <= 65_536
