"""jobs/sql.py's logic: run SQL statements over a warehouse's views, or an interactive prompt.

Why the prompt needs ``attach_user_stdin``: under ``spark-submit``, the Python driver is
not started by the user's shell but by the JVM (Spark's ``PythonRunner``), through a Java
``ProcessBuilder`` with the default redirects. Its stdout and stderr are a pipe the JVM
copies to its own stdout, and its **stdin is a fresh pipe that the JVM never writes to and
never closes** (measured here: the driver's ``/proc/self/fd/0`` is ``pipe:[A]`` while the
JVM's ``fd/0`` is the user's terminal or pipe ``pipe:[B]``). So a plain ``input()`` or
``sys.stdin.readline()`` blocks forever, with typed and with piped input alike. The
driver therefore reopens the stdin of its parent (the JVM, which inherited the user's
terminal or pipe and never reads it) and, on a terminal, talks to that terminal directly so
that readline's line editing and history work as in ``pyspark``'s own shell.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Literal

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

BANNER = (
    "deltabus SQL. Views: topics, subscriptions, messages, deliveries, backlog, backlog_history.\n"
    "End each statement with ';'. Quit with 'quit', 'exit' or Ctrl-D."
)
PROMPT = "deltabus-sql> "
CONTINUE = "           -> "
_QUIT = ("quit", "exit")


# -- splitting ------------------------------------------------------------------------
def take_statements(text: str) -> tuple[list[str], str]:
    """Split off every statement ended by ';' and return them with the unfinished rest.

    A ';' inside '...', "..." or `...` (with backslash escapes in strings, as Spark SQL
    reads them), inside a ``--`` line comment or a ``/* */`` block comment ends nothing.
    """
    done: list[str] = []
    start = 0
    i, n = 0, len(text)
    state: Literal["code", "quote", "line_comment", "block_comment"] = "code"
    quote = ""
    while i < n:
        ch = text[i]
        if state == "code":
            if ch in ("'", '"', "`"):
                state, quote = "quote", ch
            elif text.startswith("--", i):
                state = "line_comment"
                i += 1
            elif text.startswith("/*", i):
                state = "block_comment"
                i += 1
            elif ch == ";":
                stmt = text[start:i].strip()
                if stmt:
                    done.append(stmt)
                start = i + 1
        elif state == "quote":
            if ch == "\\" and quote != "`":
                i += 1  # the escaped character cannot close the string
            elif ch == quote:
                state = "code"
        elif state == "line_comment":
            if ch == "\n":
                state = "code"
        elif text.startswith("*/", i):
            state = "code"
            i += 1
        i += 1
    return done, text[start:]


def split_statements(text: str) -> list[str]:
    """Every statement of a script; the last one needs no ';'."""
    done, rest = take_statements(text)
    rest = rest.strip()
    return done + ([rest] if _strip_comments(rest).strip() else [])


def _strip_comments(text: str) -> str:
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def is_quit(text: str) -> bool:
    return text.strip().rstrip(";").strip().lower() in _QUIT


# -- running --------------------------------------------------------------------------
def run_statements(spark: "SparkSession", statements: Iterable[str], *, rows: int, say: Callable[[str], None]) -> None:
    """Run each statement; print the rows of those that return any (as ``df.show`` does)."""
    for stmt in statements:
        df = spark.sql(stmt)
        if df.columns:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                df.show(n=rows, truncate=False)
            say(buf.getvalue().rstrip("\n"))


def quiet_query_error_logs() -> None:
    """Keep a failed statement to our one line.

    PySpark 4 logs every captured SQL error at ERROR, with the JVM stack trace, on its own
    "SQLQueryContextLogger" (pyspark/errors/exceptions/base.py, ``_log_exception``, called
    for each exception it converts): 130 lines per typo at the prompt, measured here.
    """
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)


def error_line(exc: BaseException) -> str:
    """One line for a failed statement: Spark's error class and message, no JVM trace."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return f"error: {first}"


def repl(
    spark: "SparkSession",
    read_line: Callable[[str], str | None],
    *,
    rows: int,
    say: Callable[[str], None],
    say_error: Callable[[str], None] | None = None,
) -> None:
    """Read statements until EOF or quit; a failed statement prints one line and the prompt goes on.

    ``read_line(prompt)`` returns one line (without its end) or None at end of input.
    """
    report = say_error or say
    buf = ""
    while True:
        line = read_line(CONTINUE if buf else PROMPT)
        if line is None:
            stmts = split_statements(buf)  # a last statement without ';' still runs
            if stmts and not any(is_quit(s) for s in stmts):
                _run_reporting(spark, stmts, rows=rows, say=say, report=report)
            return
        if not buf and is_quit(line):
            return
        buf += line + "\n"
        stmts, buf = take_statements(buf)
        for stmt in stmts:
            if is_quit(stmt):
                return
            _run_reporting(spark, [stmt], rows=rows, say=say, report=report)
        if not _strip_comments(buf).strip():
            buf = ""  # only blanks or comments are left: back to the main prompt


def _run_reporting(spark: "SparkSession", stmts: list[str], *, rows: int, say: Callable[[str], None], report: Callable[[str], None]) -> None:
    try:
        run_statements(spark, stmts, rows=rows, say=say)
    except Exception as exc:  # keep the prompt alive; one clear line
        report(error_line(exc))


# -- the user's stdin under spark-submit ------------------------------------------------
@dataclass(frozen=True, slots=True)
class Console:
    """Where the prompt reads from; ``interactive`` is True on a terminal."""

    interactive: bool
    how: Literal["own", "parent", "tty"]


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def attach_user_stdin(*, under_spark_submit: bool, parent_pid: int | None = None, proc: str = "/proc") -> Console:
    """Make fd 0 the user's stdin, and on a terminal fds 1 and 2 that terminal too.

    ``under_spark_submit``: the driver was started by spark-submit's PythonRunner (it then
    finds ``PYSPARK_GATEWAY_PORT`` in its environment; the entry point decides). Raises
    OSError when the user's stdin cannot be reached.
    """
    if not under_spark_submit:
        return Console(os.isatty(0), "own")
    ppid = os.getppid() if parent_pid is None else parent_pid
    parent_stdin = os.path.join(proc, str(ppid), "fd", "0")
    if os.path.exists(parent_stdin):
        if _same_file(os.stat(parent_stdin), os.fstat(0)):  # stdin was forwarded after all
            return Console(os.isatty(0), "own")
        fd = os.open(parent_stdin, os.O_RDONLY)
        how: Literal["parent", "tty"] = "parent"
    else:  # no /proc (macOS): only a terminal can be found again
        try:
            fd = os.open("/dev/tty", os.O_RDONLY)
        except OSError as exc:
            raise OSError(
                "spark-submit does not pass stdin to the Python driver and it cannot be reopened here; "
                "use -e/-f, or run '.venv/bin/python jobs/sql.py'"
            ) from exc
        how = "tty"
    os.dup2(fd, 0)
    os.close(fd)
    interactive = os.isatty(0)
    if interactive:
        # Prompts, results and errors go straight to the terminal rather than through the
        # JVM's copy of our stdout, so readline's prompt and line editing work.
        out = os.open(os.ttyname(0), os.O_WRONLY)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        if isinstance(sys.stdout, io.TextIOWrapper):  # the only kind with reconfigure; a replaced stdout is left alone
            sys.stdout.reconfigure(line_buffering=True)
    return Console(interactive, how)


def console_reader(console: Console) -> Callable[[str], str | None]:
    """read_line for ``repl``: readline with a prompt on a terminal, plain lines from a pipe."""
    if console.interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - Python built without readline
            pass

        def read_tty(prompt: str) -> str | None:
            try:
                return input(prompt)
            except EOFError:
                print()
                return None

        return read_tty

    def read_pipe(prompt: str) -> str | None:
        line = sys.stdin.readline()
        return line.rstrip("\n") if line else None

    return read_pipe
