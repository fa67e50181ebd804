"""One log watcher per process: tells waiting pulls and streams that a table has a new version.

A blocking pull or a ``subscribe()`` stream's consumer that found nothing waits here instead
of sleep-polling Delta; the push job's stream source asks it for the messages table's version
each trigger (``current``: a stat of a local log instead of a log read). ONE daemon thread per process follows the
``_delta_log`` of every watched table and ``notify_all``s a ``threading.Condition`` when a
version appears; waiters re-check and go back to waiting. Contract:

- ``LogWatcher.current(uris)`` returns the versions known now (a local table is checked at
  once, one ``stat``, and re-read every ``resync_interval``); pass them to ``wait_newer`` after a read that found nothing. A commit
  made after ``current`` returned always ends the wait (no lost wake-up); one made before it
  may end it spuriously, which costs the caller one extra read.
- ``wait_newer`` returns True when a watched table moved past `seen`, False at `timeout`
  (or when `cancel` is set). Callers bound `timeout` themselves: lease expiries are
  time-based and make no commit.
- A local table is followed by a ``stat`` of its next version's JSON file every
  ``local_interval`` (20 ms) while someone waits, and its version is re-read every
  ``resync_interval`` (a re-created table goes back to version 0). A table in an object
  store is re-read with its ``read_version`` callable every ``remote_interval`` (1 s): a
  listing per poll would cost more than the sleep-polling it replaces.
- With no waiter the thread parks on the condition and uses no CPU.
- ``watch`` keeps the NEWEST registrant's ``read_version`` (clients re-register on every
  pull and stream), so a closed client's engine is not held once another registers the table.
- A read that fails in the thread is retried next pass; the first failure of each table is
  logged once (its URI and the error's type: no payloads, no storage options).

Fork safety (FACTS.md): threads do not survive ``fork``; ``watcher()`` notices the new
process id and starts a fresh watcher in the child. The thread calls ``read_version``
(deltalake) only for tables its process already opened.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

LOCAL_INTERVAL = 0.02  # seconds between stats of a local log while someone waits
REMOTE_INTERVAL = 1.0  # seconds between version reads of a table in an object store
RESYNC_INTERVAL = 10.0  # seconds between full version reads of a local table

log = logging.getLogger(__name__)


def local_log_dir(uri: str) -> str | None:
    """The ``_delta_log`` directory of a table on the local file system; None for object stores."""
    if uri.startswith("file://"):
        uri = uri.removeprefix("file://")
    elif "://" in uri:
        return None
    return os.path.join(os.path.abspath(uri), "_delta_log")


def newest_local_version(log_dir: str, known: int) -> int:
    """The highest version N >= `known` whose ``_delta_log/N.json`` exists, found by stat-ing
    known+1, known+2, ... (commits land as whole files: put-if-absent, FACTS.md)."""
    v = known
    while os.path.exists(os.path.join(log_dir, f"{v + 1:020d}.json")):
        v += 1
    return v


@dataclass(slots=True)
class _Table:
    read_version: Callable[[], int]
    log_dir: str | None
    version: int
    next_poll: float  # monotonic
    next_resync: float  # monotonic


class LogWatcher:
    """Follows the logs of registered tables on one background thread (see the module doc).

    ``interval`` settings and ``clock`` (monotonic seconds) are parameters so a test can
    make them short; ``polls`` and ``wakeups`` count the thread's passes and the waiters'
    returns from ``Condition.wait`` (a test checks the thread does not spin)."""

    def __init__(
        self,
        *,
        local_interval: float = LOCAL_INTERVAL,
        remote_interval: float = REMOTE_INTERVAL,
        resync_interval: float = RESYNC_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < local_interval <= remote_interval:
            raise ValueError("LogWatcher: need 0 < local_interval <= remote_interval")
        self._local_interval = local_interval
        self._remote_interval = remote_interval
        self._resync_interval = resync_interval
        self._clock = clock
        self._cond = threading.Condition()
        self._tables: dict[str, _Table] = {}
        self._waiters = 0
        self._cancels: list[threading.Event] = []
        self._thread: threading.Thread | None = None
        self._failed: set[str] = set()  # tables whose read failure the thread has logged
        self.polls = 0
        self.wakeups = 0

    # -- registration and reading ---------------------------------------------------
    def watch(self, uri: str, read_version: Callable[[], int]) -> int:
        """Follow `uri` from now on and return its version. `read_version` reads the table's
        current version; it replaces the one an earlier call gave (the newest registrant's is
        used, so the watcher holds no engine its registrants dropped), the version is kept."""
        with self._cond:
            t = self._tables.get(uri)
            if t is not None:
                t.read_version = read_version
        if t is None:
            version = read_version()
            now = self._clock()
            with self._cond:
                t = self._tables.setdefault(
                    uri, _Table(read_version, local_log_dir(uri), version, now, now + self._resync_interval)
                )
        return t.version

    def current(self, uris: Sequence[str]) -> dict[str, int]:
        """The versions of `uris` (each watched already) known now: a local table is checked
        at once (a stat; re-read every ``resync_interval``, so a re-created table is seen even
        by a caller that never waits), one in an object store is re-read when its last read is
        older than ``remote_interval`` (the thread only polls while someone waits). A failing
        read raises here, to the caller."""
        out: dict[str, int] = {}
        for uri in uris:
            t = self._tables[uri]
            self._poll(uri, t, self._clock())
            out[uri] = t.version
        return out

    def _advance(self, uri: str, t: _Table, version: int, forward_only: bool = False) -> bool:
        """Set the table's version; `forward_only` (a stat that may race another thread's
        newer one: ``current`` runs on any thread) never moves it back."""
        with self._cond:
            if version == t.version or (forward_only and version < t.version):
                return False
            t.version = version
            self._cond.notify_all()
            return True

    # -- waiting ------------------------------------------------------------------------
    def wait_newer(self, seen: Mapping[str, int], timeout: float, cancel: threading.Event | None = None) -> bool:
        """Wait until a table of `seen` has a version other than the one given, at most
        `timeout` seconds; also returns (False) soon after `cancel` is set."""
        def moved() -> bool:
            return any(self._tables[u].version != v for u, v in seen.items())

        deadline = self._clock() + max(0.0, timeout)
        with self._cond:
            self._ensure_thread()
            self._waiters += 1
            if cancel is not None:
                self._cancels.append(cancel)
            self._cond.notify_all()  # a parked thread starts polling
            try:
                while not moved():
                    left = deadline - self._clock()
                    if left <= 0 or (cancel is not None and cancel.is_set()):
                        return False
                    self._cond.wait(left)
                    self.wakeups += 1
                return True
            finally:
                self._waiters -= 1
                if cancel is not None:
                    self._cancels.remove(cancel)

    # -- the thread -----------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="deltabus-log-watcher", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiters == 0:
                    self._cond.wait()  # parked: nobody waits, nothing to poll
                tables = list(self._tables.items())
                if any(c.is_set() for c in self._cancels):
                    self._cond.notify_all()
            self.polls += 1
            now = self._clock()
            for uri, t in tables:
                try:
                    self._poll(uri, t, now)
                except Exception as exc:  # a table being deleted or a store hiccup: try again next pass
                    if uri not in self._failed:
                        self._failed.add(uri)
                        log.warning("deltabus log watcher: reading %s failed (%s); retrying every pass, logged once",
                                    uri, type(exc).__name__)
                    continue
            time.sleep(self._local_interval)

    def _poll(self, uri: str, t: _Table, now: float) -> None:
        if t.log_dir is not None and now < t.next_resync:
            self._advance(uri, t, newest_local_version(t.log_dir, t.version), forward_only=True)
            return
        if now < t.next_poll:
            return
        t.next_poll = now + self._remote_interval
        t.next_resync = now + self._resync_interval
        self._advance(uri, t, t.read_version())


_lock = threading.Lock()
_instance: tuple[int, LogWatcher] | None = None


def watcher() -> LogWatcher:
    """This process's log watcher, created on first use (a fresh one in a forked child)."""
    global _instance
    with _lock:
        if _instance is None or _instance[0] != os.getpid():
            _instance = (os.getpid(), LogWatcher())
        return _instance[1]
