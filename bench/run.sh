#!/usr/bin/env bash
# Run every benchmark side by side with its raw baseline (under 10 minutes on 2 cores):
#   ./bench/run.sh [--quick] [--only push,publish,pull,latency,scale]
# A full run writes the results of record, bench/results/<date>.json and .png; --quick and
# partial (--only) runs write <date>[-quick][-partial-<sections>].json/.png instead (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
exec "$DELTABUS_PY" bench/run.py "$@"
