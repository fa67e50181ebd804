#!/usr/bin/env bash
# Run a deltabus job with Spark's own spark-submit, from the project's .venv
# (created on first use). Usage: ./spark-submit.sh [spark-submit options] jobs/X.py [job args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/scripts/bootstrap.sh"
# conf/ holds spark-defaults.conf and log4j2.properties; a caller's own SPARK_CONF_DIR wins.
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$ROOT/conf}"
exec "$ROOT/.venv/bin/spark-submit" "$@"
