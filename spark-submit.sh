#!/usr/bin/env bash
# Run a deltabus job with Spark's own spark-submit, from the project's .venv (created on
# first use). Usage: ./spark-submit.sh [spark-submit options] jobs/X.py [job args]
#
# - Spark settings: conf/spark-defaults.conf and conf/log4j2.properties (SPARK_CONF_DIR);
#   cluster options (--master yarn|k8s://...|spark://..., --deploy-mode, --packages, --conf)
#   pass straight through and override them.
# - deltabus settings: conf/deltabus.conf (DELTABUS_CONF), each overridable by DELTABUS_<NAME>.
# - The library is shipped to executors that do not share this disk: build/deltabus.zip
#   (pure Python) on --py-files, and the settings file on --files. Executors still need
#   deltabus's dependencies (deltalake, pyarrow, aiohttp, pyjwt) in their Python; see README.
#   DELTABUS_SHIP=0 skips shipping.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/scripts/bootstrap.sh"

export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$ROOT/conf}"
export DELTABUS_CONF="${DELTABUS_CONF:-$ROOT/conf/deltabus.conf}"

ship=()
if [ "${DELTABUS_SHIP:-1}" != "0" ]; then
  zip="$ROOT/build/deltabus.zip"
  if [ ! -f "$zip" ] || [ -n "$(find "$ROOT/lib/deltabus" -newer "$zip" -print -quit)" ]; then
    mkdir -p "$ROOT/build"
    "$DELTABUS_PY" - "$ROOT/lib" "$zip" <<'PY'
import os, sys, zipfile
root, out = sys.argv[1], sys.argv[2]
tmp = out + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
    for d, _, files in os.walk(os.path.join(root, "deltabus")):
        for f in files:
            if f.endswith((".py", ".typed")):
                p = os.path.join(d, f)
                z.write(p, os.path.relpath(p, root))
os.replace(tmp, out)
PY
  fi
  ship=(--py-files "$zip" --files "$DELTABUS_CONF")
fi
exec "$ROOT/.venv/bin/spark-submit" "${ship[@]}" "$@"
