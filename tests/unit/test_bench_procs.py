"""bench/procs.py: one reading of /proc, on real processes."""

from __future__ import annotations

import subprocess
import sys

from bench import procs

# A child that starts a grandchild holding ~40 MB, then both wait for stdin to close.
CHILD = (
    "import subprocess, sys; "
    "g = subprocess.Popen([sys.executable, '-c', 'import sys; x = bytearray(40_000_000); print(1, flush=True); sys.stdin.read()'], "
    "stdin=subprocess.PIPE, stdout=subprocess.PIPE); "
    "g.stdout.readline(); print(g.pid, flush=True); sys.stdin.read(); g.stdin.close(); g.wait()"
)


def test_the_tree_under_a_root_with_each_process_s_parent_memory_cpu_and_command_line():
    child = subprocess.Popen([sys.executable, "-c", CHILD, "marker-arg"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        now = procs.processes(cmdline=True)
        assert procs.descendants(now, child.pid) == [grandchild]
        assert procs.tree(now, child.pid) == [child.pid, grandchild]
        assert now[grandchild].ppid == child.pid
        assert now[grandchild].rss > 40_000_000  # resident bytes, not pages
        assert "marker-arg" in now[child.pid].cmd and now[child.pid].cpu_s >= 0
        assert procs.processes()[child.pid].cmd == ""  # command lines only when asked
        assert procs.tree(now, 2**22 + 12345) == []  # a root that is gone has no tree
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(30)
