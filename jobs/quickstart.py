"""Quickstart: a topic, a pull subscription (publish, pull, ack) and a push subscription
to an endpoint on 127.0.0.1 delivered by the push job; prints what happened.

    ./spark-submit.sh jobs/quickstart.py [--warehouse PATH] [--engine delta-spark] [--verbose]

Every step (the clients and the push job) runs on one engine: --engine, else DELTABUS_ENGINE,
else auto (delta-spark when Spark has the Delta jars; ./spark-submit.sh adds them for
--engine delta-spark).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from deltabus import config  # the environment is read there, once

    parser = argparse.ArgumentParser(prog="jobs/quickstart.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--warehouse",
        default=config.warehouse_default(),
        help="warehouse path or URI holding the Delta tables (default: $DELTABUS_WAREHOUSE or ./warehouse)",
    )
    parser.add_argument("--project", default="quickstart", help="project of the topic and subscription (default: quickstart)")
    parser.add_argument(
        "--engine",
        choices=list(config.ENGINES),
        help="storage engine of every step (default: $DELTABUS_ENGINE or auto = delta-spark when Spark has the Delta jars)",
    )
    parser.add_argument("--verbose", action="store_true", help="also Spark's INFO logs, deltabus's DEBUG logs and progress bars")
    args = parser.parse_args(argv)
    from deltabus.errors import DeltabusError, InvalidArgument

    try:
        engine = args.engine or config.engine_default()
    except InvalidArgument as exc:
        print(f"quickstart: {exc.field}: {exc.rule}", file=sys.stderr)
        return 2

    import logging

    from pyspark.sql import SparkSession

    from deltabus import quickstart
    from deltabus.spark import console

    console.python_logging(args.verbose, default_level=logging.WARNING)  # it prints its own steps
    # A demo of seconds needs no web UI: it only took a port (and warned when 4040 was in use).
    builder = SparkSession.builder.appName("deltabus-quickstart").config("spark.ui.enabled", "false")
    spark = console.session_options(builder, args.verbose).getOrCreate()
    console.spark_logging(spark, args.verbose)
    try:
        result = quickstart.run(spark, args.warehouse, project=args.project, engine=engine)
    except DeltabusError as exc:  # e.g. delta-spark on a Spark without the Delta jars: one line, no traceback
        print(f"quickstart: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    ok = result["pulled"] == result["published"] and result["unacked"] == 0 and result["pushed"] == result["push_acked"] == 500
    print("quickstart " + ("OK" if ok else "FAILED") + f": {result}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
