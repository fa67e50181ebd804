"""Clients refuse calls once closed, as google-cloud-pubsub's do after ``close()``."""

from __future__ import annotations

import functools
from typing import Callable, Concatenate, ParamSpec, Protocol, TypeVar

from .errors import ClientClosed


class _Closable(Protocol):
    """A client that knows whether ``close()`` was called."""

    _closed: bool


C = TypeVar("C", bound=_Closable)
P = ParamSpec("P")
R = TypeVar("R")


def refused_when_closed(method: Callable[Concatenate[C, P], R]) -> Callable[Concatenate[C, P], R]:
    """Raise ClientClosed, naming the client and the method, once ``self._closed`` is set."""

    @functools.wraps(method)
    def guarded(self: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._closed:
            raise ClientClosed(f"{type(self).__name__}.{method.__name__}(): the client is closed; create a new one")
        return method(self, *args, **kwargs)

    return guarded
