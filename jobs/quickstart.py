"""Quickstart: a topic, a pull subscription (publish, pull, ack) and a push subscription
to an endpoint on 127.0.0.1 delivered by the push job; prints what happened.

    ./spark-submit.sh jobs/quickstart.py [--warehouse PATH] [--verbose]
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
    parser.add_argument("--verbose", action="store_true", help="also Spark's INFO logs, deltabus's DEBUG logs and progress bars")
    args = parser.parse_args(argv)

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
        result = quickstart.run(spark, args.warehouse, project=args.project)
    finally:
        spark.stop()
    ok = result["pulled"] == result["published"] and result["unacked"] == 0 and result["pushed"] == result["push_acked"] == 500
    print("quickstart " + ("OK" if ok else "FAILED") + f": {result}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
