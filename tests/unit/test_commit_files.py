"""storage.commit_files: which files a range of versions added as new rows, from the commit files alone."""

from __future__ import annotations

import json
from pathlib import Path

from deltabus.storage.commit_files import Inserted, inserted_files


def write(log: Path, version: int, *actions: dict) -> None:
    lines = [json.dumps({"commitInfo": {"operation": "X"}}), *(json.dumps(a) for a in actions)]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def add(path: str, part: str, data_change: bool = True, **extra: object) -> dict:
    return {"add": {"path": path, "partitionValues": {"p": part}, "dataChange": data_change, "size": 1, **extra}}


def test_appends_give_their_files_by_version_and_partition(tmp_path: Path) -> None:
    write(tmp_path, 3, add("p=a/f1.parquet", "a"), add("p=b/f2.parquet", "b"), {"txn": {"appId": "x", "version": 1}})
    write(tmp_path, 4, {"remove": {"path": "p=a/f1.parquet", "dataChange": False}}, add("p=a/f3.parquet", "a", data_change=False))
    write(tmp_path, 5, add("p=a/f%3D4.parquet", "a"))
    write(tmp_path, 6, {"metaData": {"id": "m"}})
    assert inserted_files(str(tmp_path), 3, 6, "p", None) == [
        Inserted(3, "p=a/f1.parquet", "a"), Inserted(3, "p=b/f2.parquet", "b"), Inserted(5, "p=a/f%3D4.parquet", "a")]
    assert inserted_files(str(tmp_path), 3, 6, "p", "b") == [Inserted(3, "p=b/f2.parquet", "b")]
    assert inserted_files(str(tmp_path), 4, 4, "p", "a") == []  # a compaction adds no rows
    assert inserted_files(str(tmp_path), 6, 5, "p", None) == []  # an empty range


def test_anything_but_added_files_leaves_it_to_the_change_feed(tmp_path: Path) -> None:
    write(tmp_path, 1, add("p=a/f1.parquet", "a"))
    write(tmp_path, 2, add("p=a/f2.parquet", "a"), {"cdc": {"path": "_change_data/c.parquet", "partitionValues": {"p": "a"}}})
    write(tmp_path, 3, {"remove": {"path": "p=a/f1.parquet", "dataChange": True}})
    write(tmp_path, 4, add("p=a/f4.parquet", "a", deletionVector={"storageType": "u"}))
    write(tmp_path, 5, add("s3://bucket/t/p=a/f5.parquet", "a"))
    write(tmp_path, 6, {"somethingNew": {}})
    assert inserted_files(str(tmp_path), 1, 1, "p", "a") == [Inserted(1, "p=a/f1.parquet", "a")]
    for v in (2, 3, 4, 5, 6):
        assert inserted_files(str(tmp_path), v, v, "p", "a") is None, v
        assert inserted_files(str(tmp_path), 1, v, "p", None) is None, v
    assert inserted_files(str(tmp_path), 7, 7, "p", None) is None  # not written (or cleaned): the feed decides


def test_absolute_paths_and_unreadable_lines_leave_it_to_the_change_feed(tmp_path: Path) -> None:
    write(tmp_path, 1, add("file:/tmp/src/p=a/f1.parquet", "a"))  # Spark's local URI (shallow clone, convert)
    write(tmp_path, 2, add("/tmp/src/p=a/f2.parquet", "a"))
    write(tmp_path, 3, add("abfss://c@a.example/t/f3.parquet", "a"))
    (tmp_path / f"{4:020d}.json").write_text('{"add": {"path": "p=a/f4.parquet", "dataChange": tr\n')
    (tmp_path / f"{5:020d}.json").write_text('["not", "an", "action"]\n')
    write(tmp_path, 6, {"add": "p=a/f6.parquet"})
    write(tmp_path, 7, add("", "a"))
    for v in range(1, 8):
        assert inserted_files(str(tmp_path), v, v, "p", None) is None, v


def test_a_null_partition_value_is_none_and_matches_no_named_partition(tmp_path: Path) -> None:
    write(tmp_path, 1, {"add": {"path": "p=__HIVE_DEFAULT_PARTITION__/f1.parquet", "partitionValues": {"p": None}, "dataChange": True}})
    write(tmp_path, 2, {"add": {"path": "f2.parquet", "partitionValues": {}, "dataChange": True}})
    assert inserted_files(str(tmp_path), 1, 2, "p", None) == [
        Inserted(1, "p=__HIVE_DEFAULT_PARTITION__/f1.parquet", None), Inserted(2, "f2.parquet", None)]
    assert inserted_files(str(tmp_path), 1, 2, "p", "a") == []
    assert inserted_files(str(tmp_path), 2, 2, None, None) == [Inserted(2, "f2.parquet", None)]
