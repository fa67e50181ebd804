"""What the push job keeps per subscription between micro-batches (driver memory).

Besides the backoff and push window, each subscription remembers why its pushes failed
recently (``reason_of``: ``http 503``, ``timeout``, ``connection refused``, ``expired``...)
so the backlog table can show it and the job can log one line when a subscription enters
or leaves backoff, or when the cause of its failures changes. Those lines name the
subscription, a scheme://host:port/path form of the endpoint and counts; never a payload,
a token or a query string.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import Iterable

from ..policy.push_backoff import WINDOW_SECONDS, PushBackoff
from ..policy.push_window import PushWindow
from .outcome import ANSWERED, SELF_DESCRIBED, PushOutcome

TOP_REASONS = 3  # error classes named in a log line
# Re-log a subscription still in backoff when its delay has moved this much since the last line.
DELAY_RELOG_FACTOR = 4.0


def reason_of(outcome: PushOutcome, status: int, error: str | None) -> str:
    """The short description of one push outcome: ``http 204``, ``http 503``, ``timeout``,
    ``expired`` or the error class of a push that got no HTTP answer."""
    if outcome in ANSWERED:
        return f"http {status}"
    if outcome in SELF_DESCRIBED:
        return outcome
    return error or "error"


def safe_endpoint(url: str) -> str:
    """scheme://host:port/path of an endpoint: no userinfo, query or fragment (they may hold secrets)."""
    from yarl import URL

    try:
        u = URL(url)
        if not u.scheme or not u.host:
            return "(endpoint)"
        return f"{u.scheme}://{u.host}:{u.port}{u.path}"
    except (ValueError, TypeError):
        return "(endpoint)"


@dataclass(frozen=True, slots=True)
class Round:
    """Outcomes of one subscription folded in one micro-batch."""

    acks: int = 0
    nacks: int = 0  # non-ack statuses, errors, timeouts and pushes expired before sending
    latency_sum: float = 0.0
    reasons: tuple[tuple[str, int], ...] = ()  # failure reason -> count, for the nacks
    last_status: str | None = None  # reason_of the round's last outcome (acks included)
    expired: int = 0  # of the nacks: pushes not sent because their lease ended first

    @property
    def total(self) -> int:
        return self.acks + self.nacks

    @property
    def mean_latency(self) -> float:
        return self.latency_sum / self.total if self.total else 0.0


def format_reasons(counts: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{r} ×{n}" for r, n in counts)


@dataclass(slots=True)
class SubState:
    backoff: PushBackoff = field(default_factory=PushBackoff)
    window: PushWindow = field(default_factory=PushWindow)
    in_flight: set[str] = field(default_factory=set)  # message ids being pushed now
    delivered: int = 0
    acked: int = 0
    nacked: int = 0
    last_status: str | None = None  # the latest outcome, e.g. "http 204"
    last_error: str | None = None  # the latest failure, e.g. "http 503" (kept after recovery)
    last_push: float | None = None  # when the latest push wave was handed to the workers
    recent_reasons: deque[tuple[float, Counter[str]]] = field(default_factory=deque)
    _logged: tuple[bool, str | None, float] = (False, None, 0.0)  # (in backoff, cause, delay) of the last line

    def reasons(self) -> list[tuple[str, int]]:
        """Failure reasons of the backoff's recent window, most frequent first."""
        total: Counter[str] = Counter()
        for _, c in self.recent_reasons:
            total.update(c)
        return sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))

    @property
    def backoff_reason(self) -> str | None:
        """The main cause of the backoff; None when not in backoff."""
        if not self.backoff.active:
            return None
        reasons = self.reasons()
        return reasons[0][0] if reasons else self.last_error

    def apply(self, r: Round, now: float, rand: float) -> str | None:
        """Fold one round in. Returns what to log about the subscription's backoff (entered,
        moved a lot, cause changed, left), or None when there is nothing new to say."""
        if r.total == 0:
            return None
        self.backoff = self.backoff.after_round(r.acks, r.nacks, now, rand, last_push=self.last_push)
        self.window = self.window.after_round(r.acks, r.nacks, r.mean_latency, expired=r.expired)
        self.acked += r.acks
        self.nacked += r.nacks
        if r.last_status is not None:
            self.last_status = r.last_status
        while self.recent_reasons and self.recent_reasons[0][0] <= now - WINDOW_SECONDS:
            self.recent_reasons.popleft()
        if r.reasons:
            self.recent_reasons.append((now, Counter(dict(r.reasons))))
            self.last_error = max(r.reasons, key=lambda kv: (kv[1], kv[0]))[0]
        return self._transition()

    def settle(self, now: float) -> str | None:
        """Called after each batch's leases: a subscription with nothing in flight gets no more
        rounds, so its backoff ends by time (``PushBackoff.settled``). Returns what to log."""
        if self.in_flight or not self.backoff.active:
            return None
        self.backoff = self.backoff.settled(now)
        return self._transition()

    def _transition(self) -> str | None:
        was_active, was_cause, was_delay = self._logged
        active, cause, delay = self.backoff.active, self.backoff_reason, self.backoff.delay
        if not active:
            if not was_active:
                return None
            self._logged = (False, None, 0.0)
            return f"recovered (no nacks in the last {WINDOW_SECONDS:g} s; last failure {self.last_error})"
        moved = was_delay > 0 and (delay >= was_delay * DELAY_RELOG_FACTOR or delay * DELAY_RELOG_FACTOR <= was_delay)
        if was_active and cause == was_cause and not moved:
            return None
        self._logged = (True, cause, delay)
        total, nacks = self.backoff.counts()
        return (
            f"backing off {delay:.1f} s ({nacks} of {total} nacked in the last {WINDOW_SECONDS:g} s; "
            f"{format_reasons(self.reasons()[:TOP_REASONS])})"
        )

    def restored(
        self,
        delivered: int,
        acked: int,
        nacked: int,
        window: int,
        backoff: float,
        backoff_until: float = 0.0,
        last_status: str | None = None,
        last_error: str | None = None,
    ) -> "SubState":
        return replace(
            self,
            delivered=delivered,
            acked=acked,
            nacked=nacked,
            window=PushWindow(size=float(max(1, window))),
            backoff=PushBackoff(delay=backoff, paused_until=backoff_until),
            last_status=last_status,
            last_error=last_error,
        )
