"""What the push job keeps per subscription between micro-batches (driver memory)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..policy.push_backoff import PushBackoff
from ..policy.push_window import PushWindow


@dataclass(frozen=True, slots=True)
class Round:
    """Outcomes of one subscription folded in one micro-batch."""

    acks: int = 0
    nacks: int = 0  # non-ack statuses, errors and timeouts
    latency_sum: float = 0.0

    @property
    def total(self) -> int:
        return self.acks + self.nacks

    @property
    def mean_latency(self) -> float:
        return self.latency_sum / self.total if self.total else 0.0


@dataclass(slots=True)
class SubState:
    backoff: PushBackoff = field(default_factory=PushBackoff)
    window: PushWindow = field(default_factory=PushWindow)
    in_flight: set[str] = field(default_factory=set)  # message ids being pushed now
    delivered: int = 0
    acked: int = 0
    nacked: int = 0

    def apply(self, r: Round, now: float, rand: float) -> None:
        if r.total == 0:
            return
        self.backoff = self.backoff.after_round(r.acks, r.nacks, now, rand)
        self.window = self.window.after_round(r.acks, r.nacks, r.mean_latency)
        self.acked += r.acks
        self.nacked += r.nacks

    def restored(self, delivered: int, acked: int, nacked: int, window: int, backoff: float) -> "SubState":
        return replace(
            self,
            delivered=delivered,
            acked=acked,
            nacked=nacked,
            window=PushWindow(size=float(max(1, window))),
            backoff=PushBackoff(delay=backoff),
        )
