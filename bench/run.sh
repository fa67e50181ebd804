#!/usr/bin/env bash
# Run every benchmark side by side with its raw baseline (under 10 minutes on 2 cores):
#   ./bench/run.sh [--quick] [--only push,publish,pull,latency,scale]
# Writes bench/results/<date>.json and bench/results/<date>.png.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
exec "$DELTABUS_PY" bench/run.py "$@"
