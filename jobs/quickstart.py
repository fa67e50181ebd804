"""Quickstart: a topic, a pull subscription (publish, pull, ack) and a push subscription
to an endpoint on 127.0.0.1 delivered by the push job; prints what happened.

    ./spark-submit.sh jobs/quickstart.py [--warehouse PATH]
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jobs/quickstart.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--warehouse",
        default=os.environ.get("DELTABUS_WAREHOUSE", "./warehouse"),
        help="warehouse path or URI holding the Delta tables (default: $DELTABUS_WAREHOUSE or ./warehouse)",
    )
    parser.add_argument("--project", default="quickstart", help="project of the topic and subscription (default: quickstart)")
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    from deltabus import quickstart

    import logging

    logging.basicConfig(level=logging.WARNING)
    spark = SparkSession.builder.appName("deltabus-quickstart").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        result = quickstart.run(spark, args.warehouse, project=args.project)
    finally:
        spark.stop()
    ok = result["pulled"] == result["published"] and result["unacked"] == 0 and result["pushed"] == 500
    print("quickstart " + ("OK" if ok else "FAILED") + f": {result}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
