"""The delivery core's vocabulary: closed sets and the typed records that cross its boundary.

Contract: nothing here reads a table or the clock. ``Op`` is the closed set of MERGE source
ops (the ``op`` column of every source row; the MERGE clauses compare to ``Op.X.value``).
``OutcomeKind`` is what a client or the push job reports about one delivery; ``Result`` is
what the core answers per ack id (exactly-once, issue 15, hands these to clients).
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Op(str, Enum):
    """What one MERGE source row does to its subscription's deliveries row."""

    INSERT = "insert"  # fan-out: a new row (leased at once when there is room)
    LEASE = "lease"  # a new delivery of an existing row: attempt + 1, new deadline
    ACK = "ack"  # delete the row when the delivery attempt still matches
    NACK = "nack"  # end the lease now (retry delay: the NACKED sentinel today)
    DEADLINE = "deadline"  # move the deadline of a current, not-nacked delivery
    GIVE_UP = "give_up"  # the attempt limit was reached: the row leaves (dead-letter, issue 13)
    CASCADE = "cascade"  # ordering keys: an earlier message of the key came back; this lease ends too
    # Seek (issue 15, ``delivery/seek``): the subscription's unacked set is replaced.
    SEEK_DROP = "seek_drop"  # the message now counts as acked: the row goes, whatever its attempt
    SEEK_KEEP = "seek_keep"  # the message stays unacked and is due at once; earlier ack ids are stale
    # The delivery history (issue 17, ``delivery/history``): a row inserted into an
    # ``_attempts-<day>`` partition; it never joins a delivery, so it only ever inserts.
    HISTORY = "history"


class OutcomeKind(str, Enum):
    """What became of one delivery."""

    ACK = "ack"
    NACK = "nack"  # includes modify_ack_deadline(0) and failed pushes
    DEADLINE = "deadline"  # modify_ack_deadline(n > 0): a lease extension
    # The lease ran out before an answer. Nothing reports it today: the push job reports
    # an unsent or expired push as NACK (push/outcome_ledger.round_of), and a pull lease
    # that runs out needs no write. It is kept for the retry policy (issue 13), which may
    # treat an expiry differently from a nack; ``outcomes`` writes it as a nack.
    EXPIRY = "expiry"
    GIVE_UP = "give_up"


class Result(str, Enum):
    """The answer for one ack id."""

    SUCCESS = "success"
    # Unknown message, already acked, superseded by a later delivery, or (for a deadline
    # change) nacked meanwhile: the ack id names no current delivery. Nothing was written.
    INVALID_ACK_ID = "invalid_ack_id"


class Lease(NamedTuple):
    """One delivery granted: the ack id is (sub_uid, message_id, delivery_attempt)."""

    message_id: str
    delivery_attempt: int
    message_version: int


class Delivery(NamedTuple):
    """A requested outcome names one delivery: its message, attempt and the row version the
    delivery was made from (None: any; ack ids of the older format carry none)."""

    message_id: str
    delivery_attempt: int
    message_version: int | None = None


# What an outcome request names: (message_id, delivery_attempt), optionally with the row's
# message_version (``Delivery``).
DeliveryRef = tuple[str, int] | tuple[str, int, int | None]


class IdResult(NamedTuple):
    """The result of one requested outcome, in request order."""

    message_id: str
    delivery_attempt: int
    result: Result
