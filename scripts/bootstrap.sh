#!/usr/bin/env bash
# Shared set-up for the README's commands: find Python >= 3.10 and Java >= 17,
# create .venv and install deltabus into it (again only when pyproject.toml changes).
# Sourced by spark-submit.sh and run-tests.sh; exports DELTABUS_PY and PYSPARK_PYTHON.
set -euo pipefail

DELTABUS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$DELTABUS_ROOT/.venv"

die() { echo "deltabus setup: $*" >&2; exit 1; }

find_python() {
  local c
  for c in "${DELTABUS_PYTHON:-}" python3.13 python3.12 python3.11 python3.10 python3; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

check_java() {
  local java="java"
  [ -n "${JAVA_HOME:-}" ] && java="$JAVA_HOME/bin/java"
  command -v "$java" >/dev/null 2>&1 || die "Java 17 or newer is required (Spark runs on it) and no 'java' was found. Install a JDK 17+ (e.g. 'apt-get install openjdk-17-jdk-headless') or set JAVA_HOME."
  local v
  v=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
  [ -n "$v" ] || die "could not read the Java version from '$java -version'."
  [ "$v" -ge 17 ] || die "Java 17 or newer is required, found Java $v at $(command -v "$java")."
}

ensure_venv() {
  local py
  py=$(find_python) || die "Python 3.10 or newer is required and none was found (tried python3.13 .. python3.10, python3; set DELTABUS_PYTHON to choose one)."
  if [ ! -x "$VENV/bin/python" ]; then
    echo "deltabus setup: creating $VENV with $($py --version 2>&1)" >&2
    "$py" -m venv "$VENV" || die "'$py -m venv' failed; on Debian/Ubuntu install the python3-venv package."
  fi
  local stamp="$VENV/.deltabus-installed" want
  want=$(cat "$DELTABUS_ROOT/pyproject.toml" | cksum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "deltabus setup: installing deltabus and its dependencies into .venv (first run takes a minute)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install --quiet -e "$DELTABUS_ROOT[test]" \
      || die "pip install failed (see above); PyPI must be reachable."
    echo "$want" > "$stamp"
  fi
}

check_java
ensure_venv
export DELTABUS_ROOT
export DELTABUS_PY="$VENV/bin/python"
export PYSPARK_PYTHON="$DELTABUS_PY"
export PYSPARK_DRIVER_PYTHON="$DELTABUS_PY"
