"""The message a ``subscribe()`` callback receives, with ack()/nack()."""

from __future__ import annotations

import datetime as dt
from concurrent.futures import Future
from typing import Mapping, Protocol

from ..errors import AcknowledgeStatus, InvalidArgument
from ..types import MAX_ACK_DEADLINE, ReceivedMessage


class RequestSink(Protocol):
    """Where a message's answers go; `future` (the ``*_with_response`` calls) is resolved with
    the answer's status, or fails with ``AcknowledgeError``."""

    def ack(self, message: "Message", future: "Future[AcknowledgeStatus] | None" = None) -> None: ...
    def nack(self, message: "Message", future: "Future[AcknowledgeStatus] | None" = None) -> None: ...
    def modify_ack_deadline(self, message: "Message", seconds: int, future: "Future[AcknowledgeStatus] | None" = None) -> None: ...


class Message:
    __slots__ = ("_received", "_sink", "_received_at")

    def __init__(self, received: ReceivedMessage, sink: RequestSink, received_at: float) -> None:
        self._received = received
        self._sink = sink
        self._received_at = received_at

    def __repr__(self) -> str:  # no payload in reprs: they end up in logs
        return f"Message(message_id={self.message_id!r}, size={self.size}, delivery_attempt={self.delivery_attempt})"

    @property
    def data(self) -> bytes:
        return self._received.message.data

    @property
    def attributes(self) -> Mapping[str, str]:
        return self._received.message.attributes

    @property
    def message_id(self) -> str:
        return self._received.message.message_id

    @property
    def publish_time(self) -> dt.datetime | None:
        return self._received.message.publish_time

    @property
    def ordering_key(self) -> str:
        return self._received.message.ordering_key

    @property
    def delivery_attempt(self) -> int:
        return self._received.delivery_attempt

    @property
    def ack_id(self) -> str:
        return self._received.ack_id

    @property
    def size(self) -> int:
        return self._received.message.size

    @property
    def received_at(self) -> float:
        return self._received_at

    def ack(self) -> None:
        """Acknowledge: the message will not be delivered again."""
        self._sink.ack(self)

    def nack(self) -> None:
        """Give the message back: it is available for delivery again at once."""
        self._sink.nack(self)

    def modify_ack_deadline(self, seconds: int) -> None:
        self._sink.modify_ack_deadline(self, _seconds(seconds))

    # -- with a response (exactly-once delivery, issue 15) -------------------------------------
    def ack_with_response(self) -> "Future[AcknowledgeStatus]":
        """Acknowledge, and learn whether it applied: the future resolves to
        ``AcknowledgeStatus.SUCCESS``, after which the message is never delivered again, or
        fails with ``AcknowledgeError`` (INVALID_ACK_ID: the lease ran out and the message
        went to another delivery). On a subscription without exactly-once delivery it
        resolves to SUCCESS once the ack was sent, as google-cloud-pubsub's does."""
        future: Future[AcknowledgeStatus] = Future()
        self._sink.ack(self, future)
        return future

    def nack_with_response(self) -> "Future[AcknowledgeStatus]":
        """``nack``, with a future as ``ack_with_response``'s."""
        future: Future[AcknowledgeStatus] = Future()
        self._sink.nack(self, future)
        return future

    def modify_ack_deadline_with_response(self, seconds: int) -> "Future[AcknowledgeStatus]":
        """``modify_ack_deadline``, with a future as ``ack_with_response``'s."""
        future: Future[AcknowledgeStatus] = Future()
        self._sink.modify_ack_deadline(self, _seconds(seconds), future)
        return future


def _seconds(seconds: int) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= MAX_ACK_DEADLINE:
        raise InvalidArgument("seconds", f"must be an integer 0..{MAX_ACK_DEADLINE}, got {seconds!r}")
    return seconds
