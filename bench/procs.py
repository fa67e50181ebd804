"""One reading of /proc for the benchmarks: each process's parent, CPU, resident bytes and
(when asked) command line, and the tree of processes under a root. Linux only, as the
machines these run on.

Used by bench/run.py (the CPU of the deliver job's tree), bench/memory.py (its resident
memory by role) and bench/chaos.py (the job's descendants to kill): one walk, not three.
"""

from __future__ import annotations

import os
from typing import NamedTuple

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Proc(NamedTuple):
    ppid: int
    cpu_s: float  # utime + stime + cutime + cstime: children it already reaped count too
    rss: int  # resident bytes
    cmd: str  # the command line, NULs as spaces ("" unless asked for)


def processes(cmdline: bool = False) -> dict[int, Proc]:
    """pid -> Proc of every process now (one gone while read is left out)."""
    out: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cmd = ""
            if cmdline:
                with open(f"/proc/{entry}/cmdline", "rb") as fb:
                    cmd = fb.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # stat's fields after the command: 4 ppid, 14-17 the CPU ticks, 24 rss in pages
        out[int(entry)] = Proc(int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK, int(fields[21]) * _PAGE, cmd)
    return out


def descendants(procs: dict[int, Proc], root: int) -> list[int]:
    """The pids under `root` (children, their children, ...), not `root` itself."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child, p in procs.items():
            if p.ppid == pid:
                out.append(child)
                todo.append(child)
    return out


def tree(procs: dict[int, Proc], root: int) -> list[int]:
    """`root` (when it still runs) and its descendants."""
    return ([root] if root in procs else []) + descendants(procs, root)
