"""Deliver every push subscription of a warehouse: a long-lived Spark structured-streaming job.

    ./spark-submit.sh jobs/deliver.py --warehouse PATH [--until-idle] [--max-seconds N]
                                      [--trigger-interval S] [--jwks-port P] [--verbose]

Subscriptions created, changed or deleted while it runs are picked up. Settings come from
conf/deltabus.conf and DELTABUS_<NAME> environment variables; flags override both.

SIGTERM or Ctrl-C stops it: nothing more is leased, the pushes in flight get up to
--drain-seconds (and their ack deadline) to finish, their outcomes are merged, the summary
is printed and it exits 0. A second signal stops without waiting for the pushes in flight.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, NoReturn

from deltabus.push.runner import DRAIN_SECONDS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, like the job's other errors
        self.exit(2, f"deliver: {message} (see --help)\n")


def _number(rule: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of seconds {rule}, got {raw!r}") from None
        if not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {rule}, got {raw}")
        return value

    return parse


def _port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {raw!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {raw}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="jobs/deliver.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warehouse", help="warehouse path or URI (default: from conf, ./warehouse)")
    p.add_argument("--until-idle", action="store_true", help="stop once nothing is left to deliver or retry")
    p.add_argument("--max-seconds", type=_number("> 0", lambda v: v > 0), help="stop after this many seconds")
    p.add_argument("--trigger-interval", type=float, help="seconds between micro-batches (default: from conf, 0.5)")
    p.add_argument("--drain-seconds", type=_number(">= 0", lambda v: v >= 0), default=DRAIN_SECONDS,
                   help=f"on stop, wait at most this long for the pushes in flight (default {DRAIN_SECONDS:g})")
    p.add_argument("--jwks-port", type=_port, help="serve the push signing keys (JWKS) over HTTP on this port (0: any free port)")
    p.add_argument("--jwks-host", default="127.0.0.1", help="address the JWKS server listens on (default 127.0.0.1)")
    p.add_argument("--allow-http", action="store_true", default=None, help="allow plain http:// endpoints (localhost, tests)")
    p.add_argument("--max-queued-bytes", type=int,
                   help="bytes of messages the push queue may hold in the driver (default: from conf, 268435456 = 256 MiB)")
    p.add_argument("--checkpoint-dir", help="structured-streaming checkpoints (default: <warehouse>/_checkpoints)")
    p.add_argument("--no-history", dest="delivery_history", action="store_false", default=None,
                   help="do not record the delivery history (default: from conf, recorded)")
    p.add_argument("--engine", choices=["auto", "delta-rs", "delta-spark"],
                   help="storage engine (default: from conf, auto = delta-spark when Spark has the Delta jars)")
    p.add_argument("--conf", help="deltabus settings file (default: conf/deltabus.conf or $DELTABUS_CONF)")
    p.add_argument("--verbose", action="store_true", help="also Spark's INFO logs, deltabus's DEBUG logs and progress bars")
    return p.parse_args(argv)


FLAGS = ("warehouse", "trigger_interval", "allow_http", "checkpoint_dir", "engine", "max_queued_bytes", "delivery_history")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from deltabus import config
    from deltabus.errors import DeltabusError, InvalidArgument
    from deltabus.storage import require_warehouse
    from deltabus.spark import console

    console.python_logging(args.verbose)
    overrides = {name: getattr(args, name) for name in FLAGS}
    try:
        settings = config.load(args.conf or config.default_path()).with_overrides(**overrides)
        # Before Spark starts: a mistyped warehouse is one line, and nothing is created there.
        require_warehouse(settings.warehouse, field="--warehouse")
    except InvalidArgument as exc:  # name the flag when the bad value came from one
        field = f"--{exc.field.replace('_', '-')}" if overrides.get(exc.field) is not None else exc.field
        print(f"deliver: {field}: {exc.rule}", file=sys.stderr)
        return 2
    except DeltabusError as exc:
        print(f"deliver: {exc}", file=sys.stderr)
        return 2

    from pyspark.sql import SparkSession

    from deltabus.push import runner
    from deltabus.spark import signals

    stop = signals.StopRequest()
    spark = console.session_options(SparkSession.builder.appName("deltabus-deliver"), args.verbose).getOrCreate()
    console.spark_logging(spark, args.verbose)
    signals.install(spark, stop)  # kept until exit: a signal during spark.stop() only sets an event
    try:
        summary = runner.run(
            spark, settings, until_idle=args.until_idle, max_seconds=args.max_seconds,
            jwks_port=args.jwks_port, jwks_host=args.jwks_host, stop=stop.stop, hurry=stop.hurry,
            stop_reason=lambda: stop.reason, drain_seconds=args.drain_seconds,
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
