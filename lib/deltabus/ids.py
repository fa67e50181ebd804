"""Message ids: unique without coordination, and ordered by publish time.

An id is ``<publish time in µs, 16 digits><batch nonce, 8 digits><index in batch, 8 digits>``.
Ids of one batch share a prefix and sort in publish order; ids sort by time across
batches, so file statistics on ``message_id`` prune lookups by id to few files.
Two batches collide only if they start in the same microsecond *and* draw the same
nonce (1 in 10^8 for that microsecond).
"""

from __future__ import annotations

import secrets

MAX_BATCH = 100_000_000


def batch_prefix(publish_time_us: int, nonce: int | None = None) -> str:
    if nonce is None:
        nonce = secrets.randbelow(100_000_000)
    return f"{publish_time_us:016d}{nonce:08d}"


def message_ids(prefix: str, count: int) -> list[str]:
    if count > MAX_BATCH:
        raise ValueError(f"a batch holds at most {MAX_BATCH} messages")
    return [f"{prefix}{i:08d}" for i in range(count)]
