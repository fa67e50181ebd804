"""StreamingPullFuture: google-cloud-pubsub's semantics.

- ``cancel()`` stops the stream (pulling, lease extension), nacks what it still held and
  resolves the future: ``result()`` then returns True.
- A stream that fails (its subscription deleted, storage errors) resolves it with that
  error: ``result()`` raises it.
- The first exception a callback raises resolves it too (``result()`` raises that
  exception), but the stream keeps running: its message is given back, later messages are
  still delivered, and later callback errors are only logged. Call ``cancel()`` to stop,
  as after ``result()`` raised in Pub/Sub's usual ``try: future.result() except: cancel()``.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable


class StreamingPullFuture(Future[bool]):
    def __init__(self, close: Callable[[], None]) -> None:
        super().__init__()
        self._close = close
        self._cancel_requested = False
        self._resolve_lock = threading.Lock()
        self.set_running_or_notify_cancel()

    def cancel(self) -> bool:
        """Stop pulling, nack what the stream held, and resolve the future (always True)."""
        self._cancel_requested = True
        self._close()
        return True

    def cancelled(self) -> bool:
        """True once ``cancel()`` was called (the stream stopped on purpose)."""
        return self._cancel_requested

    # -- called by the streaming pull manager -------------------------------------------
    def _resolve(self, set_it: Callable[[], None]) -> None:
        with self._resolve_lock:
            if not self.done():
                set_it()

    def resolve_with_callback_error(self, exc: BaseException) -> None:
        self._resolve(lambda: self.set_exception(exc))

    def resolve_with_stream_error(self, exc: BaseException) -> None:
        self._resolve(lambda: self.set_exception(exc))

    def resolve_closed(self) -> None:
        self._resolve(lambda: self.set_result(True))
