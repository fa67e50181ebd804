"""deltabus.spark.standalone without a cluster: its settings' rules and its process-tree kill."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from deltabus.errors import InvalidArgument
from deltabus.spark.standalone import ClusterSettings, _pdeathsig, kill_tree, process_tree, spark_class


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"workers": 0}, "workers"),
        ({"workers": True}, "workers"),
        ({"cores": 0}, "cores"),
        ({"cores": 2.5}, "cores"),
        ({"memory": "1"}, "memory"),
        ({"memory": "1gb"}, "memory"),
        ({"memory": "0g"}, "memory"),
        ({"host": ""}, "host"),
        ({"host": "127.0.0.1 x"}, "host"),
        ({"start_timeout": 0}, "start_timeout"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(InvalidArgument) as e:
        ClusterSettings(**kwargs)
    assert e.value.field == field


def test_defaults_are_two_workers_on_loopback():
    s = ClusterSettings()
    assert (s.workers, s.cores, s.memory, s.host) == (2, 2, "1g", "127.0.0.1")


def test_the_launcher_is_pysparks_own():
    path = spark_class()
    assert path.name == "spark-class" and os.access(path, os.X_OK)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_tree_ends_children_that_left_the_process_group():
    """As pyspark's daemon does (setpgid), a grandchild in a session of its own escapes a
    killpg of the root's group; kill_tree still ends it, with the root and the rest."""
    script = "import subprocess, time\n" \
             "a = subprocess.Popen(['sleep', '60'])\n" \
             "b = subprocess.Popen(['sleep', '60'], start_new_session=True)\n" \
             "print(a.pid, b.pid, flush=True)\n" \
             "time.sleep(60)\n"
    root = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    try:
        kids = [int(p) for p in root.stdout.readline().split()]
        tree = process_tree(root.pid)
        assert tree[0] == root.pid and set(kids) <= set(tree)
        killed = kill_tree(root.pid)
        assert set(tree) <= set(killed)
        root.wait(10)
        end = time.monotonic() + 10
        while any(_alive(p) for p in kids) and time.monotonic() < end:
            time.sleep(0.05)
        assert not any(_alive(p) for p in kids)
        assert process_tree(root.pid) == []
    finally:
        if root.poll() is None:
            root.kill()
            root.wait(10)


def test_a_daemon_dies_with_the_process_that_started_it():
    """An owner killed with SIGKILL runs no clean-up: the daemons it started go with it."""
    script = "import subprocess, sys, time\n" \
             "from deltabus.spark.standalone import _pdeathsig\n" \
             "p = subprocess.Popen(['sleep', '60'], start_new_session=True, preexec_fn=_pdeathsig())\n" \
             "print(p.pid, flush=True)\n" \
             "time.sleep(60)\n"
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        daemon = int(owner.stdout.readline())
        assert _alive(daemon)
        owner.kill()
        owner.wait(10)
        end = time.monotonic() + 10
        while _alive(daemon) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _alive(daemon)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
