"""bench/memory.py: a small real run (3 messages of 10 MB through jobs/deliver.py) and its
command line. The full-size run of record is in the README (Benchmarks)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import memory
from tests.conftest import ROOT

pytestmark = pytest.mark.spark


def test_a_small_run_pushes_every_message_and_reports_its_memory(tmp_path):
    out = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, "bench/memory.py", "--messages", "3", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(out.read_text())
    m = doc["memory"]
    assert m["messages"] == m["pushed"] == m["acked"] == 3
    assert m["backlog_bytes"] == 3 * m["message_bytes"] == 30_000_000
    # The job's own count (its last log line): all three fit under the default cap at once.
    assert m["cap_bytes"] == 256 * 1024 * 1024
    assert 0 < m["peak_held_bytes"] <= m["cap_bytes"]
    for role in ("launcher", "jvm", "python_driver", "pyspark_workers"):
        assert m["peak_rss_bytes"].get(role, 0) > 0, (role, m["peak_rss_bytes"])
    # The driver is the Python program, not a launcher (a few MiB): it imports pyspark and pyarrow.
    assert m["peak_rss_bytes"]["python_driver"] > 50 * 2**20
    assert m["peak_rss_total_bytes"] >= max(m["peak_rss_bytes"].values())
    assert m["rss_mib_every_5_s"] and doc["code"]["commit"]


def test_roles_of_the_job_s_processes():
    """Command lines as a job's tree shows them: the launchers name jobs/deliver.py too."""
    deliver = "jobs/deliver.py --warehouse /w --allow-http --trigger-interval 0.2 --engine delta-rs --until-idle"
    assert memory._role(f"bash /repo/spark-submit.sh {deliver}") == "launcher"
    assert memory._role(f"/repo/.venv/bin/python /repo/scripts/own_session.py -- /repo/.venv/bin/spark-submit {deliver}") == "launcher"
    assert memory._role(f"bash /repo/.venv/bin/spark-submit --py-files z.zip {deliver}") == "launcher"
    assert memory._role(f"/usr/lib/jvm/java-17/bin/java -cp x -Xmx1g org.apache.spark.deploy.SparkSubmit {deliver}") == "jvm"
    assert memory._role(f"/repo/.venv/bin/python /repo/{deliver}") == "python_driver"
    assert memory._role("/repo/.venv/bin/python -m pyspark.daemon pyspark.worker") == "pyspark_workers"
    assert memory._role("/repo/.venv/bin/python -m pyspark.daemon pyspark.sql.worker.plan_data_source_read") == "data_source_workers"
    assert memory._role("/repo/.venv/bin/python -m pyspark.sql.streaming.python_streaming_source_runner") == "stream_source"
    assert memory._role("/usr/bin/something-else") == "other"


def test_a_backlog_of_no_messages_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        memory.main(["--messages", "0"])
    assert exit_.value.code == 2
    assert "--messages" in capsys.readouterr().err
