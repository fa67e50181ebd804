import os
import re
import subprocess
import sys

import pytest

from deltabus import quickstart
from tests import background
from tests.conftest import ROOT

pytestmark = pytest.mark.spark

PUSH_LINE = re.compile(r"push job: (\d+) pushed, (\d+) acked by the endpoint .*; the endpoint received (\d+) of (\d+)")
# Warnings our own settings used to cause, and the console progress bar.
NOISE = ("FairSchedulableBuilder", "Failed to cancel job group", "falling behind", "ResolveWriteToStream",
         "resolves to a loopback address", "[Stage")


def push_figures(lines: list[str]) -> tuple[int, ...]:
    (m,) = [PUSH_LINE.search(l) for l in lines if PUSH_LINE.search(l)]
    return tuple(int(g) for g in m.groups())


def test_quickstart_publishes_pulls_and_acks_everything(spark, warehouse):
    lines: list[str] = []
    result = quickstart.run(spark, warehouse, say=lines.append, engine="delta-rs")
    assert result == {"published": 1101, "pulled": 1101, "unacked": 0, "pushed": 500, "push_acked": 500}
    assert any("created topic projects/quickstart/topics/orders" in l for l in lines)
    assert push_figures(lines) == (500, 500, 500, 500)
    # Running it again on the same warehouse works too, and reports that run's own figures
    # (the push subscription held the second run's pull-demo messages: 1601 pushed).
    again_lines: list[str] = []
    again = quickstart.run(spark, warehouse, say=again_lines.append, engine="delta-rs")
    assert again == result
    assert push_figures(again_lines) == (500, 500, 500, 500)
    assert any("acked 1101 messages projects/quickstart/subscriptions/orders-push got while it had no endpoint" in l
               for l in again_lines)


def test_quickstart_recovers_a_push_subscription_left_by_an_interrupted_run(spark, warehouse):
    # A run stopped mid push job leaves orders-push pushing to an endpoint that is gone.
    from deltabus import PublisherClient, SubscriberClient

    pub = PublisherClient(warehouse=warehouse)
    sub = SubscriberClient(warehouse=warehouse, allow_http=True)
    topic = pub.create_topic(name=pub.topic_path("quickstart", "orders")).name
    sub.create_subscription(name=sub.subscription_path("quickstart", "orders-push"), topic=topic,
                            push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    pub.stop()
    sub.close()
    lines: list[str] = []
    result = quickstart.run(spark, warehouse, say=lines.append, engine="delta-rs")
    assert result["pushed"] == 500 and result["push_acked"] == 500 and result["unacked"] == 0
    assert push_figures(lines) == (500, 500, 500, 500)


def test_job_help():
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "quickstart.py"), "--help"], capture_output=True, text=True, check=True)
    assert "--warehouse" in out.stdout
    assert "--verbose" in out.stdout


def readme_first_command_runs_the_job(tmp_path):
    """./spark-submit.sh jobs/quickstart.py, exactly as the README says (with a temp warehouse)."""
    env = {k: v for k, v in background.env().items() if not k.startswith("PYSPARK")}
    out = subprocess.run(
        [str(ROOT / "spark-submit.sh"), "jobs/quickstart.py", "--warehouse", str(tmp_path / "wh")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "quickstart OK" in out.stdout
    # Our lines and real problems only: no warnings our own settings cause, no progress bars.
    for noise in NOISE:
        assert noise not in out.stdout + out.stderr, (noise, out.stderr[-3000:])
    assert "SparkUI" not in out.stderr  # a 30 s demo starts no web UI (and binds no port for one)
    assert " INFO " not in out.stderr, out.stderr[-3000:]


# The README's command (a spark-submit JVM, ~32 s) runs in the background from the session's
# first test on (tests/background.py).
BACKGROUND = {"test_readme_first_command_runs_the_job": readme_first_command_runs_the_job}


def test_readme_first_command_runs_the_job(early_background):
    """./spark-submit.sh jobs/quickstart.py, exactly as the README says (with a temp warehouse)."""
    early_background.result("test_readme_first_command_runs_the_job")


@pytest.mark.cluster  # the cluster-engine group: a delta-spark quickstart costs minutes here
def test_quickstart_on_delta_spark_through_spark_submit(tmp_path):
    """./spark-submit.sh jobs/quickstart.py --engine delta-spark: the script adds the Delta jars
    and session settings, and every step (clients and the push job) runs on delta-spark."""
    from tests.conftest import DELTA_SKIP

    if DELTA_SKIP:
        pytest.skip(DELTA_SKIP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "DELTABUS_ENGINE"))}
    out = subprocess.run(
        [str(ROOT / "spark-submit.sh"), "jobs/quickstart.py", "--warehouse", str(tmp_path / "wh"), "--engine", "delta-spark"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(l.startswith("warehouse: ") and l.endswith("(engine: delta-spark)") for l in lines), out.stdout[-2000:]
    assert "quickstart OK" in out.stdout
    assert push_figures(lines) == (500, 500, 500, 500)
    # The push job wrote its stream checkpoint where the delta-spark job keeps it, and its
    # stream was the delta-spark one: Delta's change feed unioned with a rate source
    # (spark/source.py), so every batch's offsets have two source lines (the embedded engine's
    # stream has one). Delta's own line carries an offset only once a commit lands after the
    # job started; the quickstart publishes everything before, so that line is "-" here
    # (test_delta_spark_job checks Delta's offsets with publishes during the run).
    offsets = [p for p in (tmp_path / "wh" / "_checkpoints" / "deliver-delta-spark" / "offsets").iterdir() if p.name.isdigit()]
    assert offsets
    for p in offsets:
        version, _metadata, *sources = p.read_text().splitlines()
        assert version == "v1" and len(sources) == 2, (p.name, sources)
