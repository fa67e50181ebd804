#!/usr/bin/env bash
# A Spark standalone cluster on this machine: a master and workers on 127.0.0.1, each its own
# JVM, started with Spark's own launcher classes from the pyspark install in .venv
# (lib/deltabus/spark/standalone.py). Prints the master URL, runs until Ctrl-C or SIGTERM,
# then stops every daemon and executor it started.
# Usage: scripts/standalone_cluster.sh [--workers 2] [--cores 2] [--memory 1g] [--dir build/standalone]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$DELTABUS_PY" -c 'import os, sys
from deltabus.spark.standalone import main
sys.exit(main(sys.argv[1:], os.environ))' --conf-dir "$ROOT/conf" "$@"
