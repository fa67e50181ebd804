#!/usr/bin/env bash
# The chaos suite (issue 16): ./bench/chaos.sh [--quick] [--only kills,concurrent,skew,disk,damaged] [...]
# Sets up .venv like the other commands; see bench/chaos.py for the scenarios and options.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$BENCH_DIR/../scripts/bootstrap.sh"
exec "$DELTABUS_PY" "$BENCH_DIR/chaos.py" "$@"
