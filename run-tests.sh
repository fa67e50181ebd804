#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh
exec "$DELTABUS_PY" -m pytest "$@"
