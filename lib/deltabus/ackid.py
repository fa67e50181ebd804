"""Ack ids: opaque to users; they name one delivery (lease) of one message.

``<sub_uid>.<message_id>.<delivery_attempt>``: an ack or deadline change only
applies while that delivery still holds the message, so a stale ack id from an
earlier delivery can never ack or extend a later one.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidArgument


_ACK_ID = re.compile(r"^([A-Za-z0-9_\-]+)\.([0-9]{1,40})\.([0-9]{1,10})$")
MAX_ATTEMPT = 2**31 - 1


class AckId(NamedTuple):
    sub_uid: str
    message_id: str
    delivery_attempt: int


def encode(sub_uid: str, message_id: str, delivery_attempt: int) -> str:
    return f"{sub_uid}.{message_id}.{delivery_attempt}"


def decode(ack_id: object, field: str = "ack_ids") -> AckId:
    if not isinstance(ack_id, str):
        raise InvalidArgument(field, f"ack ids are strings, got {type(ack_id).__name__}")
    m = _ACK_ID.match(ack_id)
    if m is None or not 1 <= int(m.group(3)) <= MAX_ATTEMPT:
        raise InvalidArgument(field, f"{ack_id!r} is not an ack id returned by pull")
    return AckId(m.group(1), m.group(2), int(m.group(3)))
