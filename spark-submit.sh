#!/usr/bin/env bash
# Run a deltabus job with Spark's own spark-submit, from the project's .venv (created on
# first use). Usage: ./spark-submit.sh [spark-submit options] jobs/X.py [job args]
#
# - Spark settings: conf/spark-defaults.conf and conf/log4j2.properties (SPARK_CONF_DIR);
#   cluster options (--master yarn|k8s://...|spark://..., --deploy-mode, --packages, --conf)
#   pass straight through and override them.
# - deltabus settings: conf/deltabus.conf (DELTABUS_CONF), each overridable by DELTABUS_<NAME>.
# - The library is shipped to executors that do not share this disk: build/lib-<hash>/deltabus.zip
#   (pure Python) on --py-files, and the settings file on --files. Executors still need
#   deltabus's dependencies (deltalake, pyarrow, aiohttp, pyjwt) in their Python; see README.
#   DELTABUS_SHIP=0 skips shipping.
# - spark-submit runs in a session of its own (scripts/own_session.py): SIGTERM, SIGINT, SIGHUP
#   and SIGQUIT to this script's pid or group (a terminal's Ctrl-C) reach the driver JVM only,
#   never the helpers it forks (Hadoop's chmods), and the exit status is the JVM's. SIGKILL to
#   the group still ends everything: the JVM and its group are killed when this process dies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$ROOT/scripts/bootstrap.sh"
source "$ROOT/scripts/spark_master.sh"

export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$ROOT/conf}"
export DELTABUS_CONF="${DELTABUS_CONF:-$ROOT/conf/deltabus.conf}"

ship=()
if [ "${DELTABUS_SHIP:-1}" != "0" ]; then
  # One zip per content, never rewritten: a running job imports lazily from its zip, and
  # replacing that file under it (another run after an edit) broke its next import with
  # "zipimport.ZipImportError: bad local file header".
  zip="$("$DELTABUS_PY" - "$ROOT/lib" "$ROOT/build" <<'PY'
import hashlib, os, sys, time, zipfile
root, build = sys.argv[1], sys.argv[2]
files = sorted(
    os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "deltabus")) for f in fs if f.endswith((".py", ".typed"))
)
h = hashlib.sha256()
for p in files:
    h.update(os.path.relpath(p, root).encode() + b"\0")
    with open(p, "rb") as f:
        h.update(f.read() + b"\0")
out_dir = os.path.join(build, "lib-" + h.hexdigest()[:16])
out = os.path.join(out_dir, "deltabus.zip")
if not os.path.exists(out):
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for p in files:
            z.write(p, os.path.relpath(p, root))
    os.replace(tmp, out)
    # Zips of older sources go once unread for a week (relatime still updates atime daily).
    for d in os.listdir(build):
        old = os.path.join(build, d, "deltabus.zip")
        if d.startswith("lib-") and old != out and os.path.exists(old) and time.time() - os.path.getatime(old) > 7 * 86400:
            os.remove(old)
            os.rmdir(os.path.join(build, d))
print(out)
PY
)"
  ship=(--py-files "$zip" --files "$DELTABUS_CONF")
fi

# A local master's driver talks only to itself: bind it to 127.0.0.1. Otherwise Spark warns
# on every start that the hostname resolves to a loopback address and picks another interface.
if [ -z "${SPARK_LOCAL_IP:-}" ]; then
  master="$(spark_master "$SPARK_CONF_DIR/spark-defaults.conf" "$@")"
  case "$master" in local*) export SPARK_LOCAL_IP=127.0.0.1 ;; esac
fi
# The delta-spark engine: a job asked for it (--engine delta-spark, or engine = delta-spark in
# the settings) gets the Delta jars pinned in conf/deltabus.conf ([delta-spark] package), fetched once
# into build/delta-jars/, and the session settings Delta needs; a line that brings Delta itself
# (--packages io.delta:delta-spark...) gets those settings. Otherwise the arguments pass as given.
# DELTABUS_DELTA_JARS=0: the cluster's image has Delta already; only the session settings are added.
fetch=()
[ "${DELTABUS_DELTA_JARS:-1}" = "0" ] && fetch=(--no-fetch)
plan="$(mktemp)"
if ! "$DELTABUS_PY" -m deltabus.spark.delta_jars submit-args --cache "$ROOT/build/delta-jars" \
    --spark-submit "$ROOT/.venv/bin/spark-submit" "${fetch[@]}" -- "$@" >"$plan"; then
  rm -f "$plan"; exit 1
fi
mapfile -d '' args <"$plan"; rm -f "$plan"
exec "$DELTABUS_PY" "$ROOT/scripts/own_session.py" -- "$ROOT/.venv/bin/spark-submit" "${ship[@]}" "${args[@]}"
