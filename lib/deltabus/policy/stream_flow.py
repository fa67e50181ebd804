"""StreamingPull flow control (server): what one stream has outstanding, and how much more it may get.

Contract (pure: the time is passed in; one event-loop thread owns an instance):

- A message is OUTSTANDING on a stream from the moment the server leases it to that stream
  until its ack id is acked, nacked (a deadline change to 0), or its lease runs out
  without an extension. Where the outcome arrives does not matter (on the stream, or as a
  unary Acknowledge / ModifyAckDeadline, which the Python client uses): the server maps ack
  ids back to their stream and calls ``settled`` / ``extended`` here.
- ``room()``: how many messages the stream may be leased now. ``max_messages`` (the
  first request's ``max_outstanding_messages``; 0 = no limit, then ``UNLIMITED_BATCH``
  per request) minus the outstanding count; 0 while the outstanding bytes reach
  ``max_bytes`` (0 = no limit). The byte limit is checked before a lease, whose sizes are
  unknown until it is made, so a batch may pass it by up to its own size (Pub/Sub's own
  limit is soft in the same way). ``expire(now)``, called first, drops the leases that ran
  out and returns their ack ids so the server can forget them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Requests per lease call when the client sets no message limit (a round's own cap applies too).
UNLIMITED_BATCH = 1000


@dataclass(slots=True)
class StreamFlow:
    max_messages: int = 0
    max_bytes: int = 0
    _out: dict[str, tuple[int, float]] = field(default_factory=dict)  # ack id -> (size, lease end)
    _bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_messages < 0:
            raise ValueError(f"max_outstanding_messages: must be >= 0, got {self.max_messages}")
        if self.max_bytes < 0:
            raise ValueError(f"max_outstanding_bytes: must be >= 0, got {self.max_bytes}")

    @property
    def count(self) -> int:
        return len(self._out)

    @property
    def bytes(self) -> int:
        return self._bytes

    def leased(self, ack_id: str, size: int, until: float) -> None:
        """The stream was leased `ack_id` (`size` bytes) until `until`."""
        old = self._out.get(ack_id)
        if old is not None:
            self._bytes -= old[0]
        self._out[ack_id] = (size, until)
        self._bytes += size

    def settled(self, ack_id: str) -> bool:
        """Acked or nacked: no longer outstanding. False when it was not outstanding here."""
        old = self._out.pop(ack_id, None)
        if old is None:
            return False
        self._bytes -= old[0]
        return True

    def extended(self, ack_id: str, until: float) -> bool:
        """A deadline change: its lease now ends at `until`."""
        old = self._out.get(ack_id)
        if old is None:
            return False
        self._out[ack_id] = (old[0], until)
        return True

    def expire(self, now: float) -> list[str]:
        """Drop and return the ack ids whose lease ended at or before `now`."""
        gone = [a for a, (_, until) in self._out.items() if until <= now]
        for a in gone:
            self.settled(a)
        return gone

    def room(self) -> int:
        """Messages the stream may be leased now (call ``expire`` first)."""
        if self.max_bytes > 0 and self._bytes >= self.max_bytes:
            return 0
        if self.max_messages <= 0:
            return UNLIMITED_BATCH
        return max(0, self.max_messages - len(self._out))

    def ack_ids(self) -> list[str]:
        return list(self._out)
