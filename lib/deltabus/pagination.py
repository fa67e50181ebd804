"""Pages of a listing by name: page sizes and opaque page tokens (pure; no I/O).

A token holds the last name of its page (keyset paging), so a page is stable while
topics or subscriptions are created or deleted between calls: nothing listed twice, and
nothing that existed throughout is skipped. A token is only valid for the listing (kind
and project or topic) that returned it.
"""

from __future__ import annotations

import base64
import bisect
import json
from typing import Any, Sequence

from .errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100  # Pub/Sub's when page_size is unset or 0
MAX_PAGE_SIZE = 1000  # larger sizes are capped, as Pub/Sub does


def page_size(value: Any, field: str = "page_size") -> int:
    if value is None or value == 0:
        return DEFAULT_PAGE_SIZE
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(field, f"must be an integer >= 0 (0 or unset means {DEFAULT_PAGE_SIZE}), got {value!r}")
    return min(value, MAX_PAGE_SIZE)


def encode_token(kind: str, scope: str, after: str) -> str:
    raw = json.dumps({"v": 1, "k": kind, "s": scope, "a": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: Any, kind: str, scope: str, field: str = "page_token") -> str | None:
    """The name the page starts after, or None for the first page ("" or None)."""
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise InvalidArgument(field, f"must be a string returned as next_page_token, got {type(token).__name__}")
    data: object = None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except ValueError:  # bad base64, bad UTF-8 or bad JSON
        pass
    after = data.get("a") if isinstance(data, dict) and data.get("v") == 1 else None
    if not isinstance(data, dict) or not isinstance(after, str):
        raise InvalidArgument(field, "is not a page token this API returned (pass next_page_token unchanged)")
    if data.get("k") != kind or data.get("s") != scope:
        raise InvalidArgument(field, f"belongs to another listing; it is valid only for the {kind} of {scope} it came from")
    return after


def take_page(sorted_names: Sequence[str], after: str | None, size: int) -> tuple[list[str], str | None]:
    """The names of one page, and the name to continue after (None on the last page)."""
    start = 0 if after is None else bisect.bisect_right(sorted_names, after)
    page = list(sorted_names[start : start + size])
    more = start + size < len(sorted_names)
    return page, (page[-1] if more and page else None)
