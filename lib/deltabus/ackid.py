"""Ack ids: opaque to users; they name one delivery (lease) of one message.

``<sub_uid>.<message_id>.<delivery_attempt>``: an ack or deadline change only
applies while that delivery still holds the message, so a stale ack id from an
earlier delivery can never ack or extend a later one.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import InvalidArgument


class AckId(NamedTuple):
    sub_uid: str
    message_id: str
    delivery_attempt: int


def encode(sub_uid: str, message_id: str, delivery_attempt: int) -> str:
    return f"{sub_uid}.{message_id}.{delivery_attempt}"


def decode(ack_id: object, field: str = "ack_ids") -> AckId:
    if not isinstance(ack_id, str):
        raise InvalidArgument(field, f"ack ids are strings, got {type(ack_id).__name__}")
    parts = ack_id.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
        raise InvalidArgument(field, f"{ack_id!r} is not an ack id returned by pull")
    return AckId(parts[0], parts[1], int(parts[2]))
