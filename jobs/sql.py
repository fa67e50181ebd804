"""SQL over a deltabus warehouse: topics, subscriptions, messages, deliveries, backlog.

    ./spark-submit.sh jobs/sql.py -e "select subscription, num_undelivered_messages from backlog order by 2 desc"
    ./spark-submit.sh jobs/sql.py -f report.sql
    ./spark-submit.sh jobs/sql.py                  # an interactive prompt; statements end with ';'
    ./spark-submit.sh jobs/sql.py < report.sql     # statements piped in

-e and -f stop at the first failing statement and exit 1. The prompt (typed or piped)
prints one error line for a failing statement and goes on; end of input or 'quit' exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return n


def main(argv: list[str] | None = None) -> int:
    from deltabus import config  # the environment is read there, once

    p = argparse.ArgumentParser(prog="jobs/sql.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warehouse", default=config.warehouse_default(), help="warehouse path or URI (default: $DELTABUS_WAREHOUSE or ./warehouse)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-e", "--execute", help="SQL statements to run (separated by ';')")
    g.add_argument("-f", "--file", help="a file of SQL statements")
    p.add_argument("--rows", type=_positive, default=50, help="rows to show per result (default 50)")
    args = p.parse_args(argv)
    script = None
    if args.file:  # read before Spark starts: a wrong path is one line, not a trace after 10 s
        try:
            with open(args.file, encoding="utf-8") as f:
                script = f.read()
        except OSError as exc:
            print(f"error: -f {args.file}: {exc.strerror or exc}", file=sys.stderr)
            return 1

    from deltabus.spark.sql_shell import (
        BANNER,
        attach_user_stdin,
        console_reader,
        error_line,
        quiet_query_error_logs,
        repl,
        run_statements,
        split_statements,
    )

    console = None
    if not (args.execute or args.file):
        # spark-submit's PythonRunner starts this driver with PYSPARK_GATEWAY_PORT set and a stdin
        # pipe it never writes to: reattach the user's terminal or pipe before anything reads it.
        try:
            console = attach_user_stdin(under_spark_submit="PYSPARK_GATEWAY_PORT" in os.environ)
        except OSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1

    import deltabus.spark

    from deltabus.errors import DeltabusError

    try:
        spark = deltabus.spark.session(args.warehouse, app_name="deltabus-sql")
    except DeltabusError as exc:  # a mistyped --warehouse: one line, nothing created
        print(f"error: {exc}", file=sys.stderr)
        return 1
    spark.sparkContext.setLogLevel("WARN")
    quiet_query_error_logs()
    try:
        if console is None:
            text = args.execute if args.execute else script or ""
            try:
                run_statements(spark, split_statements(text), rows=args.rows, say=print)
            except Exception as exc:
                print(error_line(exc), file=sys.stderr)
                return 1
        else:
            if console.interactive:
                print(BANNER, flush=True)
            repl(
                spark,
                console_reader(console),
                rows=args.rows,
                say=lambda s: print(s, flush=True),
                say_error=lambda s: print(s, file=sys.stderr, flush=True),
            )
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
