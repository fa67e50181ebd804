"""Stopping jobs/deliver.py as operators do: SIGTERM from a scheduler, Ctrl-C from a terminal.

Through ./spark-submit.sh, which passes the signals its pid or its group gets to the driver JVM
alone (scripts/own_session.py). Every message
must be accounted for: pushed, acked at the endpoint and merged (gone from `deliveries`), or
still unacked in `deliveries` (its lease expires and it is pushed again).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.compute as pc
import pytest

from deltabus import SubscriberClient
from deltabus.storage.arrow import read_table
from tests import background
from tests.background import in_warehouse
from tests.conftest import ROOT, delivery_state
from tests.endpoints import Behaviour, Endpoint

pytestmark = pytest.mark.spark

SUMMARY = re.compile(r"^deliver: (?P<why>.+); delivered (?P<delivered>\d+), acked (?P<acked>\d+), nacked (?P<nacked>\d+)$", re.M)
# Warnings our own settings used to cause, and the console progress bar.
NOISE = ("FairSchedulableBuilder", "Failed to cancel job group", "falling behind", "ResolveWriteToStream",
         "resolves to a loopback address", "[Stage")


# Runs its arguments with SIGINT and SIGQUIT at their defaults, as a terminal's foreground job
# has them (a shell's background job, CI among them, starts with both ignored, and
# ./spark-submit.sh rightly keeps an inherited ignore), by exec: the pid stays the same.
# Not a preexec_fn: the background lanes run in threads of this process.
LIKE_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "signal.signal(signal.SIGQUIT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"]


def start(warehouse, tmp_path, *args, path_first=None):
    env = {k: v for k, v in background.env().items() if not k.startswith("PYSPARK")}
    env["DELTABUS_ALLOW_HTTP"] = "1"
    if path_first is not None:  # programs the job's processes find before the system's
        env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', os.defpath)}"
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    job = subprocess.Popen(
        [*LIKE_A_TERMINAL, str(ROOT / "spark-submit.sh"), "jobs/deliver.py", "--warehouse", warehouse, "--trigger-interval", "0.2", *args],
        cwd=ROOT, env=env, stdout=open(out, "wb"), stderr=open(err, "wb"), start_new_session=True,
    )
    return job, out, err


def wait_for_pushes(job, ep, n, err):
    deadline = time.time() + 180
    while time.time() < deadline and len(ep.snapshot()) < n:
        assert job.poll() is None, err.read_text()[-3000:]
        time.sleep(0.05)
    assert len(ep.snapshot()) >= n


def unacked_ids(warehouse) -> set[str]:
    t = delivery_state(read_table(f"{warehouse}/deliveries"))  # not the delivery history's rows
    return set(t["message_id"].to_pylist())


def push_setup(pub, topic, warehouse, ep, n=3000, **sub_args):
    sub = SubscriberClient(warehouse=warehouse, allow_http=True)
    name = sub.subscription_path("local", "stoppable")
    sub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": ep.url}, **sub_args)
    ids = pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(n)])
    sub.close()
    return set(ids)


def _first_problem(text):
    """The log around the first error line (a --verbose run's tail is Spark's shutdown chatter)."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if re.search(r"Traceback|Exception|ERROR|Error:", line)), len(lines) - 40)
    return "\n".join(lines[max(0, at - 10): at + 40])


def check_clean_stop(job, out, err, signame):
    code = job.wait(120)
    stdout, stderr = out.read_text(), err.read_text()
    assert code == 0, _first_problem(stdout + stderr)
    m = SUMMARY.search(stdout)
    assert m and m["why"] == f"{signame} received", stdout[-3000:]
    assert "Traceback" not in stderr + stdout
    assert "Exception" not in stderr, stderr[-4000:]
    assert not re.search(r"^\s+at [\w.$]+\(", stderr, re.M), stderr[-4000:]  # no Java stack trace
    return m, stdout, stderr


def check_accounted_for(published, ep, warehouse, summary):
    received = [json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()]
    unacked = unacked_ids(warehouse)
    merged = published - unacked
    assert merged | unacked == published  # nothing lost
    assert 0 < len(merged) < len(published)
    # What was in flight at the signal was pushed, acked and merged, or is still unacked:
    # every push the endpoint acked is merged, and nothing else is.
    assert set(received) == merged
    assert int(summary["acked"]) == len(received) == len(set(received))


def sigterm_to_spark_submit_stops_cleanly_and_merges_what_was_in_flight(pub, topic, warehouse, tmp_path):
    with Endpoint(Behaviour(lambda r, n: (200, 0.05))) as ep:
        published = push_setup(pub, topic, warehouse, ep)
        job, out, err = start(warehouse, tmp_path)
        try:
            wait_for_pushes(job, ep, 300, err)
            os.kill(job.pid, signal.SIGTERM)  # as a scheduler does: the spark-submit.sh pid
            summary, stdout, stderr = check_clean_stop(job, out, err, "SIGTERM")
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        check_accounted_for(published, ep, warehouse, summary)
    # Our own settings cause no warnings and no progress bars by default.
    for noise in NOISE:
        assert noise not in stderr + stdout, noise


def slow_chmod(tmp_path):
    """A directory holding a `chmod` that takes 0.3 s, for the job's PATH.

    Without Hadoop's native library, RawLocalFileSystem sets the permissions of every file it
    creates (each streaming checkpoint log file and its .crc) by forking `chmod`, which
    takes milliseconds; a Ctrl-C that lands during one used to kill it (exit 130), and Spark
    printed the ``Shell$ExitCodeException`` while the job stopped. A slow `chmod` makes that
    moment long enough to aim at. Each run leaves `<pid>.running`, renamed `<pid>.done` when
    its pause ends: one killed by a signal never gets there."""
    real = shutil.which("chmod")
    assert real, "no chmod on PATH"
    bin_dir, marks = tmp_path / "bin", tmp_path / "chmods"
    bin_dir.mkdir()
    marks.mkdir()
    script = bin_dir / "chmod"
    script.write_text(
        "#!/bin/sh\n"
        f"mark='{marks}'/$$\n"
        ': > "$mark.running"\n'
        "sleep 0.3\n"
        'mv "$mark.running" "$mark.done"\n'
        f"exec '{real}' \"$@\"\n"
    )
    script.chmod(0o755)
    return bin_dir, marks


def a_chmod_running(job, marks, err):
    deadline = time.time() + 60
    while time.time() < deadline:
        assert job.poll() is None, err.read_text()[-3000:]
        running = sorted(marks.glob("*.running"))
        if running:
            return running[0]
        time.sleep(0.01)
    raise AssertionError("no chmod ran for 60 s")


def ctrl_c_to_the_process_group_stops_cleanly(pub, topic, warehouse, tmp_path):
    bin_dir, marks = slow_chmod(tmp_path)
    with Endpoint(Behaviour(lambda r, n: (200, 0.05))) as ep:
        published = push_setup(pub, topic, warehouse, ep)
        job, out, err = start(warehouse, tmp_path, "--verbose", path_first=bin_dir)
        try:
            wait_for_pushes(job, ep, 300, err)
            running = a_chmod_running(job, marks, err)
            os.killpg(job.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the foreground group
            summary, stdout, stderr = check_clean_stop(job, out, err, "SIGINT")
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
        check_accounted_for(published, ep, warehouse, summary)
    # The chmod Hadoop was running when Ctrl-C came finished: the keypress never reached it.
    assert running.with_suffix(".done").exists(), sorted(p.name for p in marks.iterdir())
    # --verbose shows more: Spark's INFO logs.
    assert re.search(r" INFO (SparkContext|MicroBatchExecution|DAGScheduler)", stderr), stderr[-2000:]


def a_second_signal_stops_without_waiting_for_pushes_in_flight(pub, topic, warehouse, tmp_path):
    """Pushes hang far past any drain: only a second signal lets the job stop. What was
    reported is merged; what was still with the endpoint stays unacked (its lease expires)."""
    answered: list[str] = []

    def respond(r, n):
        if n <= 100:
            answered.append(json.loads(r.body)["message"]["messageId"])
            return 200, 0.0
        return 200, 30.0  # hangs past the second signal; a drain would wait for it (ack deadline 600 s)

    with Endpoint(Behaviour(respond)) as ep:
        published = push_setup(pub, topic, warehouse, ep, n=1000, ack_deadline_seconds=600)
        job, out, err = start(warehouse, tmp_path, "--drain-seconds", "600")
        try:
            wait_for_pushes(job, ep, 110, err)
            os.kill(job.pid, signal.SIGTERM)
            deadline = time.time() + 60
            while "SIGTERM: stopping" not in out.read_text():
                assert time.time() < deadline and job.poll() is None, err.read_text()[-3000:]
                time.sleep(0.05)
            time.sleep(1.5)  # a separate signal, not a copy of the first
            os.kill(job.pid, signal.SIGTERM)
            summary, stdout, _ = check_clean_stop(job, out, err, "SIGTERM")
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    assert "SIGTERM again: stopping without waiting" in stdout
    unacked = unacked_ids(warehouse)
    merged = published - unacked
    assert merged | unacked == published
    assert merged == set(answered)  # the reported acks were merged; the hanging pushes were not
    assert int(summary["acked"]) == len(answered)


# The three jobs (~95 s one after another on the CI-like run, each a spark-submit JVM using
# about one core) run in the background from the session's first test on (tests/background.py).
# Each test checks its own job, with its own warehouse, endpoint and logs, and fails with its
# own scenario's assertion.
SCENARIOS = {
    "test_sigterm_to_spark_submit_stops_cleanly_and_merges_what_was_in_flight":
        sigterm_to_spark_submit_stops_cleanly_and_merges_what_was_in_flight,
    "test_ctrl_c_to_the_process_group_stops_cleanly": ctrl_c_to_the_process_group_stops_cleanly,
    "test_a_second_signal_stops_without_waiting_for_pushes_in_flight": a_second_signal_stops_without_waiting_for_pushes_in_flight,
}


BACKGROUND = {name: in_warehouse(body) for name, body in SCENARIOS.items()}  # started by the session's first test


def test_sigterm_to_spark_submit_stops_cleanly_and_merges_what_was_in_flight(early_background):
    early_background.result("test_sigterm_to_spark_submit_stops_cleanly_and_merges_what_was_in_flight")


def test_ctrl_c_to_the_process_group_stops_cleanly(early_background):
    early_background.result("test_ctrl_c_to_the_process_group_stops_cleanly")


def test_a_second_signal_stops_without_waiting_for_pushes_in_flight(early_background):
    """Pushes hang far past any drain: only a second signal lets the job stop."""
    early_background.result("test_a_second_signal_stops_without_waiting_for_pushes_in_flight")
