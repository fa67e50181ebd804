"""Clients refuse calls once closed, as google-cloud-pubsub's do after ``close()``."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

from .errors import ClientClosed

F = TypeVar("F", bound=Callable[..., Any])


def refused_when_closed(method: F) -> F:
    """Raise ClientClosed, naming the client and the method, once ``self._closed`` is set."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClientClosed(f"{type(self).__name__}.{method.__name__}(): the client is closed; create a new one")
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]
