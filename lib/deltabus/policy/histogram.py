"""Ack-delay histogram in whole seconds, clamped to 10..600 (as python-pubsub's leaser)."""

from __future__ import annotations

import math

MIN_SECONDS = 10
MAX_SECONDS = 600


class Histogram:
    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def add(self, seconds: float) -> None:
        bucket = min(MAX_SECONDS, max(MIN_SECONDS, int(math.ceil(seconds))))
        self._counts[bucket] = self._counts.get(bucket, 0) + 1
        self._len += 1

    def percentile(self, percent: float) -> int:
        """The smallest bucket at or above `percent` of samples; 10 with no samples."""
        if not 0 <= percent <= 100:
            raise ValueError("percent must be within 0..100")
        if self._len == 0:
            return MIN_SECONDS
        target = self._len * percent / 100.0
        seen = 0
        for bucket in sorted(self._counts):
            seen += self._counts[bucket]
            if seen >= target:
                return bucket
        return max(self._counts)
