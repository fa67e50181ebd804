"""Hand-out policy: what share of each subscription's queued pushes one push worker gets. No I/O.

Pure: the ledger (``push/ledger.py``) asks it how many rows of each subscription go into the
next assignment of a worker, given what that worker already holds. Formerly ``policy/dispatch.py``.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def allocate(
    order: Sequence[str],
    queued: Mapping[str, int],
    held: Mapping[str, int],
    *,
    per_sub: int,
    limit: int,
) -> dict[str, int]:
    """Rows per subscription for a worker that already holds `held`: it may hold at most
    `per_sub` rows of any one subscription (so a slow endpoint fills only its own share),
    and one hand-out carries at most `limit` rows. Subscriptions are served in `order`
    (the caller rotates it so none is always last)."""
    if per_sub <= 0 or limit <= 0:
        raise ValueError("per_sub and limit must be positive")
    out: dict[str, int] = {}
    left = limit
    for uid in order:
        if left <= 0:
            break
        n = min(queued.get(uid, 0), per_sub - held.get(uid, 0), left)
        if n > 0:
            out[uid] = n
            left -= n
    return out
