"""jobs/sql.py's logic: run SQL statements over a warehouse's views, or a small REPL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, TextIO

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession


def split_statements(text: str) -> list[str]:
    """Split on ';' outside quotes."""
    out, cur, quote = [], [], ""
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = ""
        elif ch in ("'", '"', "`"):
            quote = ch
            cur.append(ch)
        elif ch == ";":
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [s for s in out if s]


def run_statements(spark: "SparkSession", statements: Iterable[str], *, rows: int, say: Callable[[str], None]) -> None:
    for stmt in statements:
        df = spark.sql(stmt)
        if df.columns:
            say(df._show_string(n=rows, truncate=False))  # the text df.show() prints


def repl(spark: "SparkSession", stdin: TextIO, *, rows: int, say: Callable[[str], None]) -> None:
    say("tables: topics, subscriptions, messages, deliveries, backlog. End statements with ';', quit with 'exit;' or EOF.")
    buf = ""
    prompt = "deltabus-sql> "
    while True:
        say(prompt)
        line = stdin.readline()
        if not line:
            break
        buf += line
        if ";" not in line:
            prompt = "           > "
            continue
        prompt = "deltabus-sql> "
        stmts = split_statements(buf)
        buf = ""
        if any(s.lower() in ("exit", "quit") for s in stmts):
            break
        try:
            run_statements(spark, stmts, rows=rows, say=say)
        except Exception as exc:  # keep the shell alive; one clear line
            say(f"error: {str(exc).splitlines()[0]}")
