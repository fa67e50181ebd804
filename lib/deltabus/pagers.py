"""Pagers returned by the ``list_*`` methods, shaped like google-cloud-pubsub's.

Iterating a pager yields every item, fetching later pages as it goes; ``.pages`` yields
the page responses; ``next_page_token`` is that of the page fetched last, and other
attributes are read from that page as well. Each iteration starts again at the first page.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, Protocol, TypeVar

from .types import (
    ListSnapshotsResponse,
    ListSubscriptionsResponse,
    ListTopicsResponse,
    ListTopicSubscriptionsResponse,
    Snapshot,
    Subscription,
    Topic,
)



class _Page(Protocol):
    """What a pager needs of a page response: the token of the page after it ("" on the last)."""

    @property
    def next_page_token(self) -> str: ...


R = TypeVar("R", bound=_Page)
T = TypeVar("T")


class _Pager(Generic[R, T]):
    _items_field = ""

    def __init__(self, fetch: Callable[[str], R], first: R) -> None:
        self._fetch = fetch
        self._first = first
        self._response = first

    @property
    def pages(self) -> Iterator[R]:
        response = self._response = self._first
        yield response
        while response.next_page_token:
            response = self._response = self._fetch(response.next_page_token)
            yield response

    def __iter__(self) -> Iterator[T]:
        for page in self.pages:
            yield from getattr(page, self._items_field)

    @property
    def next_page_token(self) -> str:
        return self._response.next_page_token

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not forwarded (and no recursion before __init__ ran)
            raise AttributeError(name)
        return getattr(self._response, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}<{self._response!r}>"


class ListTopicsPager(_Pager[ListTopicsResponse, Topic]):
    _items_field = "topics"


class ListSubscriptionsPager(_Pager[ListSubscriptionsResponse, Subscription]):
    _items_field = "subscriptions"


class ListTopicSubscriptionsPager(_Pager[ListTopicSubscriptionsResponse, str]):
    _items_field = "subscriptions"


class ListSnapshotsPager(_Pager[ListSnapshotsResponse, Snapshot]):
    _items_field = "snapshots"
