"""The acks ``deltabus serve`` answers before their commit: a local journal, so that a crash loses none.

Contract.

- **What goes here.** A plain Acknowledge (unary or on the stream) of ack ids this server
  leased to its own streams, none of them exactly-once or ordered (``StreamHub._journaled``),
  is written here first: one line, ``write`` then ``fdatasync`` on the journal's own thread.
  Only then is the client answered, and the ack is queued deferred (``GroupCommits.
  submit_acknowledge``): it rides in the subscription's next round with other outcomes, or
  goes after ``defer_seconds``. ``record`` returns the line's segment; ``committed(segment)``
  is called once per line when its round has committed (or the ack became moot).
- **Segments.** The journal is a series of files, ``<directory>/<uuid>.acks``, mode 0600,
  each held under an exclusive ``flock`` while its server lives (the lock, not the name,
  says so). Lines go to the newest; past SEGMENT_BYTES a new one is started, and a segment
  that is not the newest is deleted once every line in it is committed; the newest is
  emptied then. Under steady load some line is nearly always outstanding, so one file
  emptied only when none is would grow for the server's life (seen in review: 8.7 MB after
  2,000 lines with one outstanding at a time). A segment is created under a temporary name,
  locked, then renamed: a starting server's ``recover`` never sees one unlocked.
- **Recovery** (``recover``, at start, before serving): every segment in the directory whose
  lock can be taken (its server is gone: SIGKILL, a crash, a stop that could not commit)
  is read, its acks applied through `apply(subscription, encoded ack ids)`, at most
  RECOVER_CHUNK ids a call (the delivery core's ack: a stale id matches no row and changes
  nothing, so applying a line twice is harmless), then the file is deleted. A line without
  its newline was cut by a crash mid-write: its client was never answered, and it is
  skipped. A failing `apply` leaves the file for the next start. A segment still under its
  temporary name (a crash before the rename, or a power loss that lost it) is read the same
  way: usually it holds nothing.
- **A clean stop** commits the deferred acks first (``GroupCommits.flush``), then ``close()``
  deletes the segments with nothing outstanding (the rest stay, for ``recover``).
- A write that fails (a full disk) is cut back off the file, so the next line starts clean,
  and fails its ``record`` (the caller then commits that ack before answering).
- The lines hold subscription names and ack ids only: no payloads, no tokens.
- What the journal cannot do: acks are applied by the next server that STARTS on the
  warehouse. Until then, and for any other reader of the warehouse, a journaled ack not yet
  committed is a lease, and the message can be delivered again once that lease ends.

Why (measured here, bench/server.py's phases with the official Python client, 2 cores):
answering each Acknowledge only after its round's MERGE (~20-45 ms) made the client wait
for the MERGE before it sent more, and at 500 msg/s the ack rounds (~10 a second, one per
ack call) held the subscription half of the time, so a new message waited for a running
MERGE before its lease round could start. Answered from the journal (fdatasync here:
0.17 ms p50), with the acks committed about twice a second instead: streaming pull + ack
1,895 -> 5,999 msg/s with one client and 4,982 -> 8,516 with four, counted until every
ack was committed (results of record, bench/results/2026-11-27 and 2026-11-28-server.json);
publish -> callback p50 147 -> 101 ms.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

log = logging.getLogger(__name__)

SUFFIX = ".acks"
_TEMP = ".acks-new"
# A segment past this size gets a successor (a line is ~100 bytes per ack id).
SEGMENT_BYTES = 1 << 20
# The most ack ids one `apply` call of ``recover`` takes.
RECOVER_CHUNK = 5000


class _Segment:
    def __init__(self, directory: str) -> None:
        name = uuid.uuid4().hex
        temp = os.path.join(directory, name + _TEMP)
        self.path = os.path.join(directory, name + SUFFIX)
        self.fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(temp, self.path)  # locked before any recover can see it
            dirfd = os.open(directory, os.O_RDONLY)
            try:  # the rename itself durable: else a power loss could leave the lines under the temporary name
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        except BaseException:
            os.close(self.fd)
            _unlink(temp)
            raise
        self.size = 0
        self.outstanding = 0


class AckJournal:
    """This process's journal (see the module docstring). ``record`` and ``committed`` may be
    called from any thread; the files are written on the journal's one thread."""

    def __init__(self, directory: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._directory = directory
        self._segment_bytes = segment_bytes
        self._segments: dict[int, _Segment] = {}  # the journal's thread only, after this
        self._newest = 0
        self._segments[0] = _Segment(directory)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deltabus-ack-journal")
        self._closed = False
        self._lock = threading.Lock()  # `_closed` against submissions
        self.lines = 0  # lines written in all (a test reads it)

    @property
    def paths(self) -> list[str]:
        """The segments' files now (tests; read on any thread: a snapshot)."""
        return [s.path for s in list(self._segments.values())]

    def record(self, subscription: str, ack_ids: Sequence[str]) -> Future[int]:
        """Write one line; the future holds its segment once the line is durable (it fails
        when the write does, or when the journal is closed)."""
        line = (json.dumps({"subscription": subscription, "ack_ids": list(ack_ids)}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._closed:
                failed: Future[int] = Future()
                failed.set_exception(RuntimeError("the ack journal is closed"))
                return failed
            return self._thread.submit(self._write, line)

    def _write(self, line: bytes) -> int:
        seg = self._segments[self._newest]
        if seg.size >= self._segment_bytes:
            seg = _Segment(self._directory)
            self._newest += 1
            self._segments[self._newest] = seg
            self._drop_done()
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(seg.fd, view):]
            os.fdatasync(seg.fd)
        except BaseException:
            try:  # cut the partial line off: the next one must start on a line of its own
                os.ftruncate(seg.fd, seg.size)
            except OSError:  # it stays: the next line goes to a new segment (recover drops a last piece without newline)
                seg.size = max(seg.size, self._segment_bytes)
            raise
        seg.size += len(line)
        seg.outstanding += 1
        self.lines += 1
        return self._newest

    def committed(self, segment: int) -> None:
        """One line of `segment` committed (or moot)."""
        with self._lock:
            if not self._closed:
                self._thread.submit(self._done, segment)

    def _done(self, segment: int) -> None:
        seg = self._segments.get(segment)
        if seg is None:
            return
        seg.outstanding -= 1
        if seg.outstanding == 0:
            try:
                if segment == self._newest:
                    os.ftruncate(seg.fd, 0)
                    seg.size = 0
                else:
                    self._drop_done()
            except OSError as exc:  # kept: its lines are all committed, so a recovery of them is harmless
                log.warning("ack journal: could not empty or delete a segment (%s)", type(exc).__name__)

    def _drop_done(self) -> None:
        """Delete the segments before the newest with nothing outstanding."""
        for k in [k for k, s in self._segments.items() if k != self._newest and s.outstanding == 0]:
            seg = self._segments.pop(k)
            try:
                os.unlink(seg.path)
            finally:
                os.close(seg.fd)

    def close(self) -> None:
        """Stop writing; delete the segments whose every line was committed (the others stay,
        unlocked, for ``recover``)."""
        def last() -> None:
            for seg in self._segments.values():
                if seg.outstanding == 0:
                    os.unlink(seg.path)
                os.close(seg.fd)
            self._segments.clear()

        with self._lock:
            if self._closed:
                return
            self._closed = True
            done = self._thread.submit(last)
        try:
            done.result()
        finally:
            self._thread.shutdown(wait=True)


def recover(directory: str, apply: Callable[[str, list[str]], None]) -> int:
    """Apply the acks of every journal segment in `directory` whose server is gone, then
    delete it; return how many acks were applied (see the module docstring)."""
    if not os.path.isdir(directory):
        return 0
    applied = 0
    for name in sorted(os.listdir(directory)):
        if not (name.endswith(SUFFIX) or name.endswith(_TEMP)):
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
            for line in data.split(b"\n")[:-1]:  # the last piece is empty, or a line cut mid-write (never answered)
                try:
                    entry = json.loads(line)
                    ids = [str(i) for i in entry["ack_ids"]]
                    by_subscription.setdefault(str(entry["subscription"]), []).extend(ids)
                except (ValueError, KeyError, TypeError):
                    log.warning("ack journal %s: skipped a line that does not parse", name)
            count = 0
            for subscription, ids in by_subscription.items():
                for i in range(0, len(ids), RECOVER_CHUNK):
                    apply(subscription, ids[i:i + RECOVER_CHUNK])
                count += len(ids)
            _unlink(path)
            if count:
                log.info("ack journal %s: applied %d acks its server had answered", name, count)
            applied += count
        finally:
            os.close(fd)
    return applied


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
