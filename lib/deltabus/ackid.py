"""Ack ids: opaque to users; they name one delivery (lease) of one message.

``<sub_uid>.<message_id>.<delivery_attempt>.<message_version>``: an ack or deadline change
only applies while that delivery still holds the message (same attempt, same row version),
so a stale ack id from an earlier delivery can never ack or extend a later one.

Why the version (issue 15): a seek that brings back an acked message inserts a new row,
whose attempts start again at 1. The attempt alone would then name the new delivery and an
old one alike, and a late duplicate ack of the old one would ack the replay. A seek gives
every row it keeps or brings back a version no earlier row of the message had (a negative
seek epoch, ``delivery.seek``), so the version tells them apart. Ids without it (issued
before this format) still decode, and match any version.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import InvalidArgument


_ACK_ID = re.compile(r"^([A-Za-z0-9_\-]+)\.([0-9]{1,40})\.([0-9]{1,10})(?:\.(-?[0-9]{1,20}))?\Z")  # \Z: no final newline
MAX_ATTEMPT = 2**31 - 1


class AckId(NamedTuple):
    sub_uid: str
    message_id: str
    delivery_attempt: int
    message_version: int | None = None  # None: an id of the older format (matches any version)


def encode(sub_uid: str, message_id: str, delivery_attempt: int, message_version: int | None = None) -> str:
    base = f"{sub_uid}.{message_id}.{delivery_attempt}"
    return base if message_version is None else f"{base}.{message_version}"


def decode(ack_id: object, field: str = "ack_ids") -> AckId:
    if not isinstance(ack_id, str):
        raise InvalidArgument(field, f"ack ids are strings, got {type(ack_id).__name__}")
    m = _ACK_ID.match(ack_id)
    if m is None or not 1 <= int(m.group(3)) <= MAX_ATTEMPT:
        raise InvalidArgument(field, f"{ack_id!r} is not an ack id returned by pull")
    version = m.group(4)
    return AckId(m.group(1), m.group(2), int(m.group(3)), None if version is None else int(version))
