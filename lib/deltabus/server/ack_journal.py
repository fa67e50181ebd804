"""The acks ``deltabus serve`` answers before their commit: a local journal, so that a crash loses none.

Contract.

- **What goes here.** A plain Acknowledge (unary or on the stream) of ack ids this server
  leased to its own streams, none of them exactly-once or ordered (``StreamHub.acknowledge``),
  is written here first: one line, ``write`` then ``fdatasync`` on the journal's own thread.
  Only then is the client answered, and the ack is queued deferred (``GroupCommits.
  submit_acknowledge``): it rides in the subscription's next round with other outcomes, or
  goes after ``defer_seconds``. ``committed()`` is called once per line when its round has
  committed (or its subscription is gone); when no line is outstanding the file is emptied.
- **One file per server process**, ``<directory>/<uuid>.acks``, mode 0600, held under an
  exclusive ``flock`` for the process's life. The lock, not the name, says its server lives.
- **Recovery** (``recover``, at start, before serving): every journal file in the directory
  whose lock can be taken (its server is gone: SIGKILL, a crash, a stop that could not
  commit) is read, its acks applied through `apply(subscription, encoded ack ids)` (the
  delivery core's ack: a stale id matches no row and changes nothing, so applying a line
  twice is harmless), then the file is deleted. A line without its newline was cut by a
  crash mid-write: its client was never answered, and it is skipped. A failing `apply`
  leaves the file for the next start.
- **A clean stop** commits the deferred acks first (``GroupCommits.flush``), then ``close()``
  deletes the file when nothing is outstanding (else it stays, for ``recover``).
- The lines hold subscription names and ack ids only: no payloads, no tokens.

Why (measured here, bench/server.py's phases with the official Python client, 2 cores):
answering each Acknowledge only after its round's MERGE (~20-45 ms) made the client wait
for the MERGE before it sent more, and at 500 msg/s the ack rounds (~10 a second, one per
ack call) held the subscription half of the time, so a new message waited for a running
MERGE before its lease round could start. Answered from the journal (fdatasync here:
0.17 ms p50), with the acks committed twice a second instead: streaming pull + ack 1,994 ->
7,300 msg/s with one client and 5,458 -> 11,971 with four; publish -> callback p50 ~116 ->
87-95 ms (one run each; the results of record are in bench/results/).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

log = logging.getLogger(__name__)

SUFFIX = ".acks"


class AckJournal:
    """This process's journal file (see the module docstring). ``record`` and ``committed``
    may be called from any thread; the file is written on the journal's one thread."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(directory, f"{uuid.uuid4().hex}{SUFFIX}")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltabus-ack-journal")
        self._outstanding = 0  # lines written and not yet committed (the journal's thread only)
        self.lines = 0  # lines written in all (a test reads it)

    def record(self, subscription: str, ack_ids: Sequence[str]) -> Future[None]:
        """Write one line (durable when the returned future is done; it fails when the write does)."""
        line = (json.dumps({"subscription": subscription, "ack_ids": list(ack_ids)}, separators=(",", ":")) + "\n").encode()
        return self._thread.submit(self._write, line)

    def _write(self, line: bytes) -> None:
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view):]
        os.fdatasync(self._fd)
        self._outstanding += 1
        self.lines += 1

    def committed(self) -> None:
        """One line's acks committed (or moot): the file is emptied once none is outstanding."""
        self._thread.submit(self._done)

    def _done(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            os.ftruncate(self._fd, 0)

    def close(self) -> None:
        """Stop writing; delete the file when every line was committed (else leave it, locked
        no more, for ``recover``)."""
        def last() -> None:
            if self._outstanding == 0:
                os.unlink(self.path)
            os.close(self._fd)

        try:
            self._thread.submit(last).result()
        finally:
            self._thread.shutdown(wait=True)


def recover(directory: str, apply: Callable[[str, list[str]], None]) -> int:
    """Apply the acks of every journal in `directory` whose server is gone, then delete it;
    return how many acks were applied (see the module docstring)."""
    if not os.path.isdir(directory):
        return 0
    applied = 0
    for name in sorted(os.listdir(directory)):
        if not name.endswith(SUFFIX):
            continue
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # another starting server recovered it first
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its server is alive
                continue
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
            by_subscription: dict[str, list[str]] = {}
            lines = data.split(b"\n")
            for line in lines[:-1]:  # the last piece is empty, or a line cut mid-write (never answered)
                try:
                    entry = json.loads(line)
                    ids = [str(i) for i in entry["ack_ids"]]
                    by_subscription.setdefault(str(entry["subscription"]), []).extend(ids)
                except (ValueError, KeyError, TypeError):
                    log.warning("ack journal %s: skipped a line that does not parse", name)
            count = 0
            for subscription, ids in by_subscription.items():
                apply(subscription, ids)
                count += len(ids)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            if count:
                log.info("ack journal %s: applied %d acks its server had answered", name, count)
            applied += count
        finally:
            os.close(fd)
    return applied
