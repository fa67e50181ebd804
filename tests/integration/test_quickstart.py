import os
import subprocess
import sys

import pytest

from deltabus import quickstart
from tests.conftest import ROOT

pytestmark = pytest.mark.spark


def test_quickstart_publishes_pulls_and_acks_everything(spark, warehouse):
    lines: list[str] = []
    result = quickstart.run(spark, warehouse, say=lines.append)
    assert result == {"published": 1101, "pulled": 1101, "unacked": 0, "pushed": 500}
    assert any("created topic projects/quickstart/topics/orders" in l for l in lines)
    # Running it again on the same warehouse works too.
    again = quickstart.run(spark, warehouse, say=lines.append)
    assert again == result


def test_job_help():
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "quickstart.py"), "--help"], capture_output=True, text=True, check=True)
    assert "--warehouse" in out.stdout


def test_readme_first_command_runs_the_job(tmp_path):
    """./spark-submit.sh jobs/quickstart.py, exactly as the README says (with a temp warehouse)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    out = subprocess.run(
        [str(ROOT / "spark-submit.sh"), "jobs/quickstart.py", "--warehouse", str(tmp_path / "wh")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "quickstart OK" in out.stdout
