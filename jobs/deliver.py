"""Deliver every push subscription of a warehouse: a long-lived Spark structured-streaming job.

    ./spark-submit.sh jobs/deliver.py --warehouse PATH [--until-idle] [--max-seconds N]
                                      [--trigger-interval S] [--jwks-port P]

Subscriptions created, changed or deleted while it runs are picked up. Settings come from
conf/deltabus.conf and DELTABUS_<NAME> environment variables; flags override both.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jobs/deliver.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warehouse", help="warehouse path or URI (default: from conf, ./warehouse)")
    p.add_argument("--until-idle", action="store_true", help="stop once nothing is left to deliver or retry")
    p.add_argument("--max-seconds", type=float, help="stop after this many seconds")
    p.add_argument("--trigger-interval", type=float, help="seconds between micro-batches (default: from conf, 0.5)")
    p.add_argument("--jwks-port", type=int, help="serve the push signing keys (JWKS) over HTTP on this port (0: any free port)")
    p.add_argument("--jwks-host", default="127.0.0.1", help="address the JWKS server listens on (default 127.0.0.1)")
    p.add_argument("--allow-http", action="store_true", default=None, help="allow plain http:// endpoints (localhost, tests)")
    p.add_argument("--checkpoint-dir", help="structured-streaming checkpoints (default: <warehouse>/_checkpoints)")
    p.add_argument("--engine", choices=["auto", "delta-rs", "delta-spark"],
                   help="storage engine (default: from conf, auto = delta-spark when Spark has the Delta jars)")
    p.add_argument("--conf", help="deltabus settings file (default: conf/deltabus.conf or $DELTABUS_CONF)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from pyspark.sql import SparkSession

    from deltabus import config
    from deltabus.errors import DeltabusError
    from deltabus.push import runner

    settings = config.load(args.conf or config.default_path()).with_overrides(
        warehouse=args.warehouse,
        trigger_interval=args.trigger_interval,
        allow_http=args.allow_http,
        checkpoint_dir=args.checkpoint_dir,
        engine=args.engine,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    spark = SparkSession.builder.appName("deltabus-deliver").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        summary = runner.run(
            spark, settings, until_idle=args.until_idle, max_seconds=args.max_seconds,
            jwks_port=args.jwks_port, jwks_host=args.jwks_host, stop=stop,
        )
    except DeltabusError as exc:  # a setting or the cluster does not fit: say which, no traceback
        print(f"deliver: {exc}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(f"deliver: {summary.stopped_because}; delivered {summary.delivered}, acked {summary.acked}, nacked {summary.nacked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
