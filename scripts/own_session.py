"""Run a command in a session of its own; relay stop signals to it; kill its group if we die.

    own_session.py -- COMMAND [ARG...]

spark-submit.sh ends with this (standard library only: it starts before anything else).
Why: a terminal's Ctrl-C (and ``kill -TERM -<pgid>``) signals every process of the
foreground process group, and with ``exec spark-submit`` that group held the driver JVM and
every process it forks. Without Hadoop's native library, Hadoop's RawLocalFileSystem sets
the permissions of each file it creates (every streaming checkpoint log file and its .crc)
by forking a shell ``chmod``; one that a Ctrl-C killed exits 130, Hadoop throws
``Shell$ExitCodeException`` and Spark prints it while the job stops. No Hadoop setting
avoids that fork (3.4's RawLocalFileSystem.setPermission is NativeIO or ``chmod``, nothing
else), so the JVM and its children are moved out of reach instead:

    this process (the caller's pid and group: what a scheduler or a terminal signals)
     └─ leader: a second copy of this script, in a new session (no controlling terminal)
         └─ COMMAND (the JVM), in a process group of its own inside that session
             └─ everything it forks: the Python driver, Hadoop's chmods, pyspark's daemon

- SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to this process, or to its group, go to
  COMMAND's process alone, as ``kill <pid>`` did when spark-submit.sh exec'd it. A signal
  inherited as ignored (``nohup``, a shell's background job) stays ignored.
- The exit status is COMMAND's: its code, or death by the same signal.
- When this process dies, SIGKILL included, the leader sees its pipe close and SIGKILLs
  COMMAND's whole group, so ``kill -KILL -<pgid>`` still ends the job at once. When
  COMMAND ends, whatever is left in its group (a Python driver whose JVM died) is killed.
- COMMAND keeps the caller's stdin, stdout and stderr. It has no controlling terminal, so
  the terminal's job control (Ctrl-Z) stops this process but not the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import NoReturn

RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
LEADER = "--leader-watching-fd"


class Relay:
    """Sends each relayed signal this process gets to one pid, once there is one; until then it
    keeps them. Signals inherited as ignored are left ignored. Handlers run on the main thread."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self._pending: list[int] = []
        for sig in RELAYED:
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.pid is None:
            self._pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.pid is not None
        try:
            os.kill(self.pid, signum)
        except ProcessLookupError:  # it ended already; its status is on its way
            pass

    def to(self, pid: int) -> None:
        self.pid = pid
        while self._pending:
            self._send(self._pending.pop(0))


def exit_like(status: int) -> NoReturn:
    """End this process as the child whose Popen returncode is `status` ended."""
    if status < 0:
        sig = -status
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two no process can handle
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        sys.exit(128 + sig)  # a signal that does not end a process (SIGCHLD, SIGCONT...)
    sys.exit(status)


def outer(command: list[str]) -> NoReturn:
    relay = Relay()
    read_end, write_end = os.pipe()  # write_end is held by this process only: it closes when we die
    # The leader starts with the relayed signals blocked (a blocked set is inherited through
    # fork and exec) and unblocks them once its handlers are in: one sent meanwhile, to us or
    # to it, waits instead of ending it through Python's defaults (a KeyboardInterrupt trace).
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    leader = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), LEADER, str(read_end), "--", *command],
        pass_fds=(read_end,), start_new_session=True,
    )
    os.close(read_end)
    relay.to(leader.pid)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    exit_like(leader.wait())


def _wait_without_reaping(job: "subprocess.Popen[bytes]") -> None:
    """Until `job` ended. Where waitid exists, it stays a zombie, so its pid (its group's id)
    is not reused before its group is killed."""
    if not hasattr(os, "waitid"):  # macOS
        job.wait()
        return
    try:
        os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # pragma: no cover - reaped already
        pass


def lead(watched_fd: int, command: list[str]) -> NoReturn:
    os.set_inheritable(watched_fd, False)
    relay = Relay()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)  # kept until the command runs; it starts unblocked
    group: dict[str, object] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        job = subprocess.Popen(command, **group)  # type: ignore[call-overload]
    except OSError as exc:
        print(f"own_session.py: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127)
    relay.to(job.pid)
    lock = threading.Lock()
    reaped = False

    def kill_group() -> None:
        with lock:
            if not reaped:
                try:
                    os.killpg(job.pid, signal.SIGKILL)
                except ProcessLookupError:  # nobody is left in it
                    pass

    def watch() -> None:
        while os.read(watched_fd, 1):  # nothing is written: b"" once the outer process is gone
            pass
        kill_group()

    threading.Thread(target=watch, daemon=True).start()
    _wait_without_reaping(job)
    kill_group()  # what the job left in its group: it has ended, so have they
    with lock:
        reaped = True
        status = job.wait()
    exit_like(status)


def main(argv: list[str]) -> NoReturn:
    if len(argv) >= 4 and argv[0] == LEADER and argv[2] == "--":
        lead(int(argv[1]), argv[3:])
    if len(argv) >= 2 and argv[0] == "--":
        outer(argv[1:])
    print("usage: own_session.py -- COMMAND [ARG...]", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
