#!/usr/bin/env bash
# The subscription as a Spark stream vs a plain batch read (issue 17): ./bench/stream_source.sh [--messages N] [...]
# Sets up .venv like the other commands; see bench/stream_source.py for what it measures.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$BENCH_DIR/../scripts/bootstrap.sh"
exec "$DELTABUS_PY" "$BENCH_DIR/stream_source.py" "$@"
