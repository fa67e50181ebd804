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
     ├─ COMMAND (the JVM): leader of a new session and process group, no controlling terminal
     │   └─ everything it forks: the Python driver, Hadoop's chmods, pyspark's daemon
     └─ reaper: a second copy of this script in a session of its own, holding a pipe from us

- SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to this process, or to its group, go to
  COMMAND's process alone, as ``kill <pid>`` did when spark-submit.sh exec'd it. A signal
  inherited as ignored (``nohup``, a shell's background job) stays ignored.
- The exit status is COMMAND's: its code, or death by the same signal. When COMMAND ends,
  whatever is left in its group (a Python driver whose JVM died) is killed.
- When this process dies, SIGKILL included, COMMAND dies with it (Linux: the kernel sends it
  SIGKILL, ``PR_SET_PDEATHSIG``, before our parent learns we died, as a SIGKILL of the whole
  group did), and the reaper, seeing the pipe close without a word, SIGKILLs COMMAND's
  group: ``kill -KILL -<pgid>`` still ends the job.
- COMMAND keeps the caller's stdin, stdout and stderr. Having no controlling terminal, it
  reads a terminal without SIGTTIN (jobs/sql.py's prompt), and the terminal's job control
  (Ctrl-Z) stops this process but not the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Callable, NoReturn

RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
REAPER = "--reap-when-closed"


class Relay:
    """Sends each relayed signal this process gets to one pid, once there is one; until then it
    keeps them. Signals inherited as ignored are left ignored. Handlers run on the main thread."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.stopped = False
        self._pending: list[int] = []
        for sig in RELAYED:
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.stopped:  # the command ended: its pid may be reaped and reused
            return
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
        try:  # a JVM that died of SIGSEGV/SIGABRT left its core: ours must not replace it
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, ValueError, OSError):  # pragma: no cover - no such limit here
            pass
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two no process can handle
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        sys.exit(128 + sig)  # a signal that does not end a process (SIGCHLD, SIGCONT...)
    sys.exit(status)


def _pdeathsig_kill() -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child SIGKILL when we die (Linux ``prctl(PR_SET_PDEATHSIG)``,
    kept across exec), or None where there is no prctl. libc is looked up here, not in the child."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def set_pdeathsig() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))

    return set_pdeathsig


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


def outer(command: list[str]) -> NoReturn:
    relay = Relay()
    # Our children start with the relayed signals blocked: a copy sent to our group in the
    # moment before a child leaves it then waits instead of killing it (a handler inherited
    # over fork would run our relay in the child until exec). The reaper keeps them blocked;
    # the command unblocks them once in its own session. We unblock ours (also those a
    # caller left blocked) at the end.
    signal.pthread_sigmask(signal.SIG_BLOCK, RELAYED)
    read_end, write_end = os.pipe()  # write_end is held by this process only: it closes when we die
    reaper = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), REAPER, str(read_end)],
        pass_fds=(read_end,), start_new_session=True, stdin=subprocess.DEVNULL,
    )
    os.close(read_end)
    pdeathsig = _pdeathsig_kill()
    me = os.getpid()

    def own_session() -> None:
        os.setsid()
        if pdeathsig is not None:
            pdeathsig()
            if os.getppid() != me:  # we died before that took: do not start at all
                os._exit(137)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)

    try:
        job = subprocess.Popen(command, preexec_fn=own_session)
    except OSError as exc:
        print(f"own_session.py: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        sys.exit(127)
    os.write(write_end, b"%d\n" % job.pid)
    relay.to(job.pid)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED)
    _wait_without_reaping(job)
    relay.stopped = True  # still a zombie here: nothing relayed so far reached another process
    try:
        os.killpg(job.pid, signal.SIGKILL)  # what it left in its group: it has ended, so have they
    except ProcessLookupError:  # nobody is left in it
        pass
    try:
        # Before reaping it: once reaped, its pid (the group's id) may be reused, and a reaper
        # that saw us die after that would kill a stranger's group.
        os.write(write_end, b"done\n")  # the reaper leaves quietly
    except BrokenPipeError:  # someone killed it; the job is over anyway
        pass
    status = job.wait()
    reaper.wait()
    exit_like(status)


def reap(watched_fd: int) -> NoReturn:
    """Read the command's pid from the outer process, then wait for it to say "done". If the
    pipe closes before that (it died), SIGKILL the command's group."""
    said = b""
    while b"done\n" not in said:
        chunk = os.read(watched_fd, 64)
        if not chunk:  # the outer process died
            pid = said.split(b"\n")[0]
            if pid.isdigit():
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        said += chunk
    sys.exit(0)


def main(argv: list[str]) -> NoReturn:
    if len(argv) == 2 and argv[0] == REAPER:
        reap(int(argv[1]))
    if len(argv) >= 2 and argv[0] == "--":
        outer(argv[1:])
    print("usage: own_session.py -- COMMAND [ARG...]", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
