"""SQL over a deltabus warehouse: topics, subscriptions, messages, deliveries, backlog.

    ./spark-submit.sh jobs/sql.py -e "select subscription, num_undelivered_messages from backlog order by 2 desc"
    ./spark-submit.sh jobs/sql.py -f report.sql
    ./spark-submit.sh jobs/sql.py                  # an interactive spark-sql style prompt
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jobs/sql.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warehouse", default=os.environ.get("DELTABUS_WAREHOUSE", "./warehouse"), help="warehouse path or URI (default: $DELTABUS_WAREHOUSE or ./warehouse)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-e", "--execute", help="SQL statements to run (separated by ';')")
    g.add_argument("-f", "--file", help="a file of SQL statements")
    p.add_argument("--rows", type=int, default=50, help="rows to show per result (default 50)")
    args = p.parse_args(argv)

    import deltabus.spark
    from deltabus.spark.sql_shell import repl, run_statements, split_statements

    spark = deltabus.spark.session(args.warehouse, app_name="deltabus-sql")
    spark.sparkContext.setLogLevel("WARN")
    try:
        if args.execute or args.file:
            text = args.execute if args.execute else open(args.file).read()
            try:
                run_statements(spark, split_statements(text), rows=args.rows, say=print)
            except Exception as exc:
                print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
                return 1
        else:
            repl(spark, sys.stdin, rows=args.rows, say=lambda s: print(s, end="" if s.endswith("> ") else "\n", flush=True))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
