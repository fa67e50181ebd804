"""jobs/deliver.py as users run it: through ./spark-submit.sh, including a crash and restart."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from deltabus import SubscriberClient
from deltabus.spark.standalone import kill_tree
from tests import background
from tests.background import in_warehouse
from tests.conftest import ROOT
from tests.endpoints import Behaviour, Endpoint
from tests.leaks import Secrets

pytestmark = pytest.mark.spark

EMAIL = "pusher@local.iam.gserviceaccount.com"
SECRET_ATTR = "SECRET-ATTR-deliver-job"


def start_job(warehouse, *args, log_path):
    env = {k: v for k, v in background.env().items() if not k.startswith("PYSPARK")}
    env["DELTABUS_ALLOW_HTTP"] = "1"
    log = open(log_path, "ab")
    return subprocess.Popen(
        [str(ROOT / "spark-submit.sh"), "jobs/deliver.py", "--warehouse", warehouse, "--trigger-interval", "0.2", *args],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def test_help():
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "deliver.py"), "--help"], capture_output=True, text=True, check=True)
    for flag in ("--warehouse", "--until-idle", "--max-seconds", "--trigger-interval", "--jwks-port"):
        assert flag in out.stdout


def sigkill_mid_run_and_restart_loses_nothing(pub, topic, warehouse, tmp_path):
    sub = SubscriberClient(warehouse=warehouse, allow_http=True)
    with Endpoint(Behaviour(lambda r, n: (200, 0.02))) as ep:
        s = sub.subscription_path("local", "crashy")
        # With OIDC tokens and recognisable payloads: the job's log must show none of them (below).
        sub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url, "oidc_token": {"service_account_email": EMAIL}})
        published = []
        for start in range(0, 4000, 1000):
            published += pub.publish_batch(topic, [{"data": f"SECRET-PAYLOAD-{i}".encode(), "attributes": {"secret": SECRET_ATTR}}
                                                   for i in range(start, start + 1000)])
        log_path = tmp_path / "deliver.log"
        job = start_job(warehouse, log_path=log_path)
        try:
            deadline = time.time() + 120
            while time.time() < deadline and len(ep.snapshot()) < 300:
                assert job.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.1)
            assert len(ep.snapshot()) >= 300
        finally:
            # The whole job at once: spark-submit.sh, the JVM, the Python driver and the push
            # workers, which pyspark's daemon keeps in a group of their own (after a killpg of the
            # job's group they went on pushing what they held until the daemon saw the JVM die,
            # and those pushes could land after the count below). Frozen first, nothing escapes.
            kill_tree(job.pid)
            job.wait(30)
        before = {json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()}
        pushes_before = len(ep.snapshot())
        assert 0 < len(before) < len(published)

        again = start_job(warehouse, "--until-idle", "--max-seconds", "180", log_path=log_path)
        assert again.wait(240) == 0, log_path.read_text()[-3000:]
        received = [json.loads(r.body)["message"] for r in ep.snapshot()]
        assert {m["messageId"] for m in received} == set(published)  # no message lost
        assert sub.get_backlog(s).num_unacked_messages == 0  # and every one acked
        assert "nothing left to deliver or retry" in log_path.read_text()
        # The summary counts this run, not the counters restored from the first run's backlog.
        summary = re.findall(r"^deliver: nothing left to deliver or retry; delivered (\d+), acked (\d+)", log_path.read_text(), re.M)
        assert summary and int(summary[-1][1]) == len(ep.snapshot()) - pushes_before
        # No secret in the log of both runs (stdout and stderr): the key, the tokens, payloads.
        secrets = Secrets()
        secrets.add_key_file(f"{warehouse}/_keys/signing-key.pem")
        tokens = {r.headers["Authorization"].removeprefix("Bearer ") for r in ep.snapshot()}
        assert tokens and all(t.startswith("eyJ") for t in tokens)
        for i, token in enumerate(sorted(tokens)):
            secrets.add_token(f"token {i}", token)
        secrets.add_payload("every payload's first 15 bytes", b"SECRET-PAYLOAD-")  # whole base64 groups: a prefix of each payload's
        secrets.add("the secret attribute value", SECRET_ATTR)
        assert not secrets.found(log_path.read_text())


def spark_submit_ships_the_library_and_settings(_tmp):
    env = {k: v for k, v in background.env().items() if not k.startswith(("PYSPARK", "DELTABUS_CONF"))}
    out = subprocess.run([str(ROOT / "spark-submit.sh"), "tests/integration/jobs/where_is_deltabus.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    executor = next(l for l in out.stdout.splitlines() if l.startswith("EXECUTOR"))
    assert executor.count("deltabus.zip/deltabus/__init__.py") == 2  # from the shipped zip, not the driver's disk
    assert f"CONF {ROOT / 'conf' / 'deltabus.conf'}" in out.stdout


def a_master_without_a_slot_to_spare_is_refused_with_the_rule(pub, _topic, warehouse, _tmp):
    env = {k: v for k, v in background.env().items() if not k.startswith("PYSPARK")}
    out = subprocess.run([str(ROOT / "spark-submit.sh"), "--master", "local[1]", "jobs/deliver.py", "--warehouse", warehouse, "--until-idle"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    both = out.stdout + out.stderr
    assert out.returncode == 2, both[-4000:]
    assert "deliver: spark.master: the push job needs at least 2 task slots" in both
    assert "Traceback" not in both


# The three spark-submit runs (the crash test's two jobs ~50-67 s, the others ~13 s and ~12 s,
# a JVM start each) run in the background from the session's first test on (tests/background.py).
SCENARIOS = {
    "test_sigkill_mid_run_and_restart_loses_nothing": in_warehouse(sigkill_mid_run_and_restart_loses_nothing),
    "test_spark_submit_ships_the_library_and_settings": spark_submit_ships_the_library_and_settings,
    "test_a_master_without_a_slot_to_spare_is_refused_with_the_rule": in_warehouse(a_master_without_a_slot_to_spare_is_refused_with_the_rule),
}


BACKGROUND = SCENARIOS  # started by the session's first test (tests/background.py)


def test_sigkill_mid_run_and_restart_loses_nothing(early_background):
    early_background.result("test_sigkill_mid_run_and_restart_loses_nothing")


def test_spark_submit_ships_the_library_and_settings(early_background):
    early_background.result("test_spark_submit_ships_the_library_and_settings")


def test_a_master_without_a_slot_to_spare_is_refused_with_the_rule(early_background):
    early_background.result("test_a_master_without_a_slot_to_spare_is_refused_with_the_rule")


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--max-seconds", "0"], "--max-seconds"),
        (["--max-seconds", "-5"], "--max-seconds"),
        (["--max-seconds", "soon"], "--max-seconds"),
        (["--trigger-interval", "0"], "--trigger-interval"),
        (["--drain-seconds", "-1"], "--drain-seconds"),
        (["--jwks-port", "70000"], "--jwks-port"),
        (["--max-queued-bytes", "0"], "--max-queued-bytes"),
        (["--max-queued-bytes", "lots"], "--max-queued-bytes"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_and_exit_2(args, flag, tmp_path):
    warehouse = str(tmp_path / "wh")
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "deliver.py"), "--warehouse", warehouse, *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"deliver: ") and flag in lines[0], out.stderr
    assert not os.path.exists(warehouse)  # nothing written


def test_a_missing_warehouse_is_one_line_and_creates_nothing(tmp_path):
    warehouse = str(tmp_path / "typo" / "warehouse")
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "deliver.py"), "--warehouse", warehouse, "--until-idle"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == f"deliver: no warehouse at {warehouse}"
    assert not os.path.exists(tmp_path / "typo")


def test_a_warehouse_that_is_a_file_names_the_flag(tmp_path):
    path = tmp_path / "file"
    path.write_text("not a warehouse")
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "deliver.py"), "--warehouse", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deliver: --warehouse: "), out.stderr
    assert path.read_text() == "not a warehouse"
