"""StreamingPullFuture: runs until cancelled or until the stream fails."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable


class StreamingPullFuture(Future):  # type: ignore[type-arg]
    def __init__(self, close: Callable[[], None]) -> None:
        super().__init__()
        self._close = close
        self._cancel_requested = False
        self.set_running_or_notify_cancel()

    def cancel(self) -> bool:
        """Stop pulling, nack what the stream held, and resolve the future."""
        self._cancel_requested = True
        self._close()
        return True

    def cancelled(self) -> bool:
        return self._cancel_requested
