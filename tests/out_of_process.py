"""The pytest plugin of an out-of-process run (tests/background.py): it appends one JSON line
per test report (setup, call, teardown) to the file named by DELTABUS_TEST_REPORTS, which the
parent session turns back into each test's outcome."""

from __future__ import annotations

import json
import os

import pytest

from tests.background import REPORTS


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(REPORTS)
    if not path:
        return
    record: dict[str, object] = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome}
    if report.failed:
        record["longrepr"] = report.longreprtext
        record["sections"] = [[title, text] for title, text in report.sections]
    if report.skipped:
        if hasattr(report, "wasxfail"):
            record["wasxfail"] = report.wasxfail
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        record["reason"] = reason.removeprefix("Skipped: ")
    with open(path, "a", encoding="utf-8") as out:  # one write per line: a kill cuts at most the last
        out.write(json.dumps(record) + "\n")
