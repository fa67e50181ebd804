"""storage/delta_spark.py parts that need no SparkSession."""

from __future__ import annotations

import inspect

import pytest

from deltabus.storage.delta_spark import _conflict_types

delta_errors = pytest.importorskip("delta.exceptions")
captured = pytest.importorskip("delta.exceptions.captured")


def _conflicts(module: object) -> list[type[BaseException]]:
    return [
        c for n, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, BaseException) and (n.startswith("Concurrent") or n.endswith("ChangedException") or "ConcurrentModification" in n)
    ]


def test_every_delta_conflict_exception_reruns_the_transaction() -> None:
    # What a MERGE raises is the captured class (pyspark converts the JVM exception to it).
    raised = _conflicts(captured)
    assert {c.__name__ for c in raised} >= {"ConcurrentAppendException", "ConcurrentWriteException"}
    caught = _conflict_types()
    missing = [c.__name__ for c in raised + _conflicts(delta_errors) if not issubclass(c, caught)]
    assert missing == []
