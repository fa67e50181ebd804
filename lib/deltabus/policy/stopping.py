"""How a long-running job reads the stop signals it gets (SIGTERM, SIGINT). No I/O.

The first signal asks for a graceful stop: lease nothing more, let the pushes in flight
finish (within a bound) and merge their outcomes. A second one asks to hurry: stop waiting
and merge what has been reported so far. Later ones change nothing (SIGKILL stops at once;
leases then expire and nothing is lost).

One keypress or one ``kill`` can arrive more than once: a terminal's Ctrl-C reaches the
whole foreground process group, so under spark-submit both the driver JVM and the Python
driver receive it (and ``systemd`` sends SIGTERM to every process of a service). A signal
of the same name within ``same_within`` seconds of the last one counted is that same event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..errors import InvalidArgument

Stage = Literal["running", "stopping", "hurrying"]


@dataclass(frozen=True, slots=True)
class StopSignals:
    same_within: float = 1.0  # seconds; both copies of one Ctrl-C arrive within milliseconds
    stage: Stage = "running"
    last_name: str | None = None
    last_at: float = float("-inf")
    first_name: str | None = None  # the signal that started the stop, for the summary

    def __post_init__(self) -> None:
        if not 0 <= self.same_within <= 60:
            raise InvalidArgument("same_within", f"must be 0..60 seconds, got {self.same_within}")

    def after(self, name: str, now: float) -> "StopSignals":
        """The state after signal `name` (e.g. "SIGTERM") arrived at `now` (monotonic seconds)."""
        if name == self.last_name and now - self.last_at < self.same_within:
            return self  # the same event, delivered to another process of the job
        stage: Stage = "stopping" if self.stage == "running" else "hurrying"
        return StopSignals(self.same_within, stage, name, now, self.first_name or name)
