#!/usr/bin/env bash
# Run every benchmark side by side with its raw baseline (about 30 minutes on 2 cores, 20 of them
# publishing the 10M backlog; --quick under 3):
#   ./bench/run.sh [--quick] [--only push,publish,pull,latency,scale,idle,engines,server] [--out STEM]
# A full run writes the results of record, bench/results/<date>.json and .png; --quick and
# partial (--only) runs write <date>[-quick][-partial-<sections>].json/.png instead (git-ignored).
# It runs from any directory; a relative --out is taken from the directory it was run in.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$BENCH_DIR/../scripts/bootstrap.sh"
exec "$DELTABUS_PY" "$BENCH_DIR/run.py" "$@"
