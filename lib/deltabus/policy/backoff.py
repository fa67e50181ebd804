"""Exponential backoff with full jitter, for commit-conflict retries and idle polling."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Backoff:
    initial: float = 0.005
    maximum: float = 0.5
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.initial <= 0:
            raise InvalidArgument("backoff.initial", f"must be > 0, got {self.initial}")
        if self.maximum < self.initial:
            raise InvalidArgument("backoff.maximum", f"must be >= initial ({self.initial}), got {self.maximum}")
        if self.multiplier < 1:
            raise InvalidArgument("backoff.multiplier", f"must be >= 1, got {self.multiplier}")

    def ceiling(self, attempt: int) -> float:
        """Upper bound of the delay before retry number `attempt` (0-based)."""
        if attempt < 0:
            raise ValueError("attempt must be >= 0")
        # Avoid float overflow for large attempts: stop multiplying once past the cap.
        value = self.initial
        for _ in range(attempt):
            value *= self.multiplier
            if value >= self.maximum:
                return self.maximum
        return min(value, self.maximum)

    def delay(self, attempt: int, rand: float) -> float:
        """Full jitter: a delay in [ceiling/2, ceiling], `rand` drawn from [0, 1)."""
        c = self.ceiling(attempt)
        return c / 2 + c / 2 * rand
