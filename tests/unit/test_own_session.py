"""scripts/own_session.py, which spark-submit.sh runs spark-submit through, with real processes.

The command stands in for the driver JVM: it forks a child into its group (as the JVM forks
Hadoop's chmods and the Python driver), reports the ids, and notes each signal it gets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Callable

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")

OWN_SESSION = str(ROOT / "scripts" / "own_session.py")
# Reports its ids and its child's, then one line per SIGINT/SIGTERM; exits with argv[1] once
# the parent's input says so ("exit"), or at EOF.
COMMAND = r"""
import json, os, signal, subprocess, sys
def note(signum, _frame):  # os.write: a handler's print can land inside the main thread's print
    os.write(1, (signal.Signals(signum).name + "\n").encode())
for sig in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(sig) != signal.SIG_IGN:
        signal.signal(sig, note)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "child": child.pid,
                  "int_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN}), flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
sys.exit(int(sys.argv[1]))
"""


def like_a_terminal(then: Callable[[], object] | None = None) -> Callable[[], None]:
    """A ``preexec_fn``: SIGINT and SIGQUIT at their defaults, as a terminal's foreground job
    has them, whatever this test process inherited (a shell's background job, CI among them,
    starts with both ignored, and the launcher rightly keeps an inherited ignore), then `then`."""

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        if then is not None:
            then()

    return preexec


def start(code: int = 0, then: Callable[[], object] | None = None) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen(
        [sys.executable, OWN_SESSION, "--", sys.executable, "-c", COMMAND, str(code)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=like_a_terminal(then),
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def ended(pid: int) -> bool:
    """Gone, or a zombie waiting for init."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate("exit\n", timeout=30)
    return proc.returncode, out


def test_the_command_runs_in_a_session_and_group_of_its_own_and_its_exit_code_is_ours():
    proc, ids = start(code=7)
    try:
        assert ids["sid"] != os.getsid(0) and ids["sid"] != os.getsid(proc.pid)
        assert ids["pgid"] == ids["pid"] == ids["sid"] != proc.pid  # its own group and session, not the caller's
        code, _ = finish(proc)
        assert code == 7
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_ctrl_c_to_our_group_reaches_the_command_alone_once():
    proc, ids = start()
    try:
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: every process of the foreground group
        assert proc.stdout.readline().strip() == "SIGINT"
        time.sleep(0.3)  # time enough for a copy the child got too to have ended it
        assert not ended(ids["child"])  # the command's own child never got it
        os.kill(proc.pid, signal.SIGTERM)  # as a scheduler does: our pid
        assert proc.stdout.readline().strip() == "SIGTERM"
        code, rest = finish(proc)
        assert code == 0 and rest == ""  # each signal arrived once
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_sigkill_to_our_group_ends_the_command_and_what_it_forked():
    proc, ids = start()
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    wait_until(lambda: ended(ids["pid"]) and ended(ids["child"]), "the command or its child outlived a SIGKILL of the group")


def test_what_the_command_left_in_its_group_is_killed_when_it_ends():
    proc, ids = start(code=3)
    code, _ = finish(proc)
    assert code == 3
    wait_until(lambda: ended(ids["child"]), "the command's child outlived it")


def test_death_by_a_signal_is_passed_on():
    proc, ids = start()
    try:
        os.kill(ids["pid"], signal.SIGKILL)  # the JVM killed (the kernel's OOM killer, say)
        assert proc.wait(30) == -signal.SIGKILL
        wait_until(lambda: ended(ids["child"]), "the command's child outlived it")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_signal_inherited_as_ignored_stays_ignored():
    """A shell's background job (or nohup) starts with SIGINT ignored: so does the command."""
    proc, ids = start(then=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert ids["int_ignored"]
        os.killpg(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.stdout.readline().strip() == "SIGTERM"  # we outlived the SIGINT; the command had it ignored
        assert finish(proc)[0] == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_usage_and_a_missing_command():
    bad = subprocess.run([sys.executable, OWN_SESSION, "no-dashes"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr
    missing = subprocess.run([sys.executable, OWN_SESSION, "--", "/nonexistent/spark-submit"], capture_output=True,
                             text=True, timeout=30)
    assert missing.returncode == 127 and "cannot run /nonexistent/spark-submit" in missing.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_once_is_not_lost_and_prints_no_trace(sig):
    """Sent before any handler is in: our process starts with it blocked, and it arrives once
    our handlers are in, before the command exists. It is kept for the command, which (sleep)
    dies of it, and nothing prints a trace."""
    proc = subprocess.Popen(
        [sys.executable, OWN_SESSION, "--", "sleep", "600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=like_a_terminal(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [sig])),
    )
    try:
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out, err) == (-sig, "", "")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
