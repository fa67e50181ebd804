"""deltabus.push.runner's pure decision: a query failure after a stop was asked for."""

from deltabus.push.runner import failed_while_stopping

# What the JVM reported in the chaos test when SIGTERM to the job's process group killed the
# chmod Hadoop forks for a checkpoint log file (the first line of StreamingQueryException).
SEEN = ("[STREAM_FAILED] Query [id = 4f3007a0, runId = cd69fa0c] terminated with exception:  SQLSTATE: XXKST\n"
        "=== Streaming Query ===\nIdentifier: deltabus-deliver")


def test_a_failure_without_a_stop_is_raised():
    assert failed_while_stopping(False, SEEN) is None
    assert failed_while_stopping(False, "") is None


def test_a_failure_after_a_stop_is_one_line_to_log():
    assert failed_while_stopping(True, SEEN) == "[STREAM_FAILED] Query [id = 4f3007a0, runId = cd69fa0c] terminated with exception:  SQLSTATE: XXKST"
    assert failed_while_stopping(True, "\n\n  boom  \nmore") == "boom"
    assert failed_while_stopping(True, "") == "unknown error"
    assert len(failed_while_stopping(True, "x" * 1000) or "") == 300
