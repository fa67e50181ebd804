"""Groups single publishes into batches, one Delta commit per batch (like Pub/Sub's BatchSettings).

Ordering keys (issue 13, as Pub/Sub's publisher client): one thread commits a topic's batches
one after another, in the order they filled, so a key's messages keep publish order (ids
within a commit, versions across commits). A batch that fails PAUSES every ordering key it
held: the messages of those keys still waiting in later batches fail with
``OrderingKeyPaused`` instead of being committed (they would land after a gap), and so does
every new publish with such a key, at once, until ``resume(topic, key)``. Messages without
a key, and other keys, are not affected.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from ..errors import ClientClosed, OrderingKeyPaused
from .rows import OutgoingMessage
from ..types import BatchSettings

log = logging.getLogger(__name__)

CommitFn = Callable[[str, Sequence[OutgoingMessage]], Sequence[str]]


class _Batch:
    __slots__ = ("topic", "messages", "futures", "nbytes", "opened")

    def __init__(self, topic: str, opened: float) -> None:
        self.topic = topic
        self.messages: list[OutgoingMessage] = []
        self.futures: list[Future[str]] = []
        self.nbytes = 0
        self.opened = opened


class Batcher:
    """One background thread; per topic an open batch that commits when full or old enough."""

    def __init__(self, commit: CommitFn, settings: BatchSettings, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._commit = commit
        self._settings = settings
        self._monotonic = monotonic
        self._cond = threading.Condition()
        self._open: dict[str, _Batch] = {}
        self._ready: list[_Batch] = []
        self._closed = False
        self._paused: set[tuple[str, str]] = set()  # (topic, ordering key) after a failed batch
        self._thread = threading.Thread(target=self._run, name="deltabus-publisher", daemon=True)
        self._thread.start()

    def submit(self, topic: str, message: OutgoingMessage) -> "Future[str]":
        fut: Future[str] = Future()
        with self._cond:
            if self._closed:
                raise ClientClosed("PublisherClient.publish(): cannot publish on a stopped publisher; create a new one")
            if message.ordering_key and (topic, message.ordering_key) in self._paused:
                fut.set_exception(OrderingKeyPaused(topic, message.ordering_key))
                return fut
            batch = self._open.get(topic)
            if batch is not None and (
                len(batch.messages) + 1 > self._settings.max_messages or batch.nbytes + message.size > self._settings.max_bytes
            ):
                self._ready.append(self._open.pop(topic))
                batch = None
            if batch is None:
                batch = self._open[topic] = _Batch(topic, self._monotonic())
            batch.messages.append(message)
            batch.futures.append(fut)
            batch.nbytes += message.size
            if len(batch.messages) >= self._settings.max_messages or batch.nbytes >= self._settings.max_bytes:
                self._ready.append(self._open.pop(topic))
            self._cond.notify()
        return fut

    def _take_due(self) -> list[_Batch]:
        now = self._monotonic()
        due = self._ready
        self._ready = []
        for topic in [t for t, b in self._open.items() if self._closed or now - b.opened >= self._settings.max_latency]:
            due.append(self._open.pop(topic))
        return due

    def _next_wait(self) -> float | None:
        if self._ready:
            return 0.0
        if not self._open:
            return None
        oldest = min(b.opened for b in self._open.values())
        return max(0.0, oldest + self._settings.max_latency - self._monotonic())

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    due = self._take_due()
                    if due or (self._closed and not self._open):
                        break
                    self._cond.wait(self._next_wait())
                stop = self._closed and not self._open and not self._ready
            for batch in due:
                self._send(batch)
            if stop and not due:
                return

    def resume(self, topic: str, ordering_key: str) -> None:
        """Let publishes with `ordering_key` on `topic` through again (no-op when not paused)."""
        with self._cond:
            self._paused.discard((topic, ordering_key))

    def _send(self, batch: _Batch) -> None:
        with self._cond:  # messages of keys paused since they were queued fail, uncommitted
            paused = {m.ordering_key for m in batch.messages if m.ordering_key and (batch.topic, m.ordering_key) in self._paused}
        messages, futures = batch.messages, batch.futures
        if paused:
            keep = [m.ordering_key not in paused for m in messages]
            for m, f, k in zip(messages, futures, keep):
                if not k:
                    f.set_exception(OrderingKeyPaused(batch.topic, m.ordering_key))
            messages = [m for m, k in zip(messages, keep) if k]
            futures = [f for f, k in zip(futures, keep) if k]
            if not messages:
                return
        try:
            ids = self._commit(batch.topic, messages)
        except BaseException as exc:  # deliver any failure to every waiting future
            with self._cond:
                self._paused.update((batch.topic, m.ordering_key) for m in messages if m.ordering_key)
            for f in futures:
                f.set_exception(exc)
            return
        for f, mid in zip(futures, ids):
            f.set_result(mid)

    def flush_and_stop(self, timeout: float | None = None) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
