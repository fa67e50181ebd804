"""deltabus.push.runner's pure decision: a query failure after a stop was asked for."""

from deltabus.push.runner import exception_chain, failed_while_stopping

# The outer failure the JVM reported in the chaos test when SIGTERM to the job's process group
# killed the chmod Hadoop fork for a checkpoint log file, and causes of the kinds seen.
OUTER = ("[STREAM_FAILED] Query [id = 4f3007a0, runId = cd69fa0c] terminated with exception:  SQLSTATE: XXKST\n"
         "=== Streaming Query ===\nIdentifier: deltabus-deliver")
KILLED_CHMOD = "UnknownException: org.apache.hadoop.util.Shell$ExitCodeException: exitCode=143"
NO_FORK = ('UnknownException: java.io.IOException: Cannot run program "chmod": error=0, '
           "Failed to exec spawn helper: pid: 4242, exit value: 1")


def test_a_failure_without_a_stop_is_raised():
    assert failed_while_stopping(False, [OUTER, KILLED_CHMOD]) is None
    assert failed_while_stopping(False, []) is None


def test_a_forked_child_dying_after_a_stop_is_its_cause_line_to_log():
    assert failed_while_stopping(True, [OUTER, KILLED_CHMOD]) == KILLED_CHMOD
    assert failed_while_stopping(True, [OUTER, NO_FORK]) == NO_FORK
    assert failed_while_stopping(True, ["  \n  " + KILLED_CHMOD + "  \nmore"]) == KILLED_CHMOD
    assert len(failed_while_stopping(True, ["ExitCodeException exitCode=143 " + "x" * 1000]) or "") == 300
    interrupted = "PythonException: KeyboardInterrupt"
    assert failed_while_stopping(True, [OUTER, interrupted]) == interrupted


def test_any_other_failure_is_raised_even_after_a_stop():
    assert failed_while_stopping(True, [OUTER]) is None
    assert failed_while_stopping(True, [OUTER, "UnknownException: java.lang.OutOfMemoryError: Java heap space"]) is None
    # chmod failing on its own (a full disk, a bad permission) is no signal's doing
    assert failed_while_stopping(True, [OUTER, "UnknownException: org.apache.hadoop.util.Shell$ExitCodeException: exitCode=1"]) is None
    assert failed_while_stopping(True, []) is None


def test_the_chain_is_outermost_first_and_ends_on_a_loop():
    class Captured(Exception):
        """Shaped like pyspark's CapturedException: the JVM cause kept in _cause."""

    inner = Captured("org.apache.hadoop.util.Shell$ExitCodeException: exitCode=143")
    outer = Captured("terminated with exception")
    outer._cause = inner  # type: ignore[attr-defined]
    assert exception_chain(outer) == ["Captured: terminated with exception",
                                      "Captured: org.apache.hadoop.util.Shell$ExitCodeException: exitCode=143"]
    inner._cause = outer  # type: ignore[attr-defined]
    assert len(exception_chain(outer)) == 2
    try:
        try:
            raise ValueError("first")
        except ValueError as first:
            raise RuntimeError("second") from first
    except RuntimeError as second:
        assert exception_chain(second) == ["RuntimeError: second", "ValueError: first"]


def test_a_text_that_cannot_be_had_does_not_hide_the_failure():
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("the JVM is gone")

    assert exception_chain(Unprintable()) == ["Unprintable: (no text: RuntimeError)"]
