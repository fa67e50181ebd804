"""The closed set of push outcomes: what became of one push a worker was handed.

* ``ack``: the endpoint answered with an ack status (102, 200, 201, 202, 204);
* ``nack``: it answered with any other status;
* ``timeout``: no answer within the request's timeout (the subscription's ack deadline);
* ``error``: no HTTP answer at all (refused, reset, TLS, DNS...; the class is in ``error``);
* ``expired``: not sent, because the lease ended while the push waited in a worker.

Every outcome but ``ack`` counts as a nack of the message.

A ``Literal`` with constants, not an ``Enum``: outcomes travel as plain strings in the
``outcome`` Arrow column (``OUTCOME_SCHEMA``) and in ``sender.send``'s result tuples, which
callers print and compare with plain strings. A Literal type-checks every use with no
conversion at those boundaries; an Enum member would need ``.value`` at each of them.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

PushOutcome = Literal["ack", "nack", "timeout", "error", "expired"]

ACK: Final = "ack"
NACK: Final = "nack"
TIMEOUT: Final = "timeout"
ERROR: Final = "error"
EXPIRED: Final = "expired"

ALL_OUTCOMES: Final[tuple[PushOutcome, ...]] = get_args(PushOutcome)
# Outcomes that carry an HTTP status (the rest have status 0).
ANSWERED: Final[frozenset[PushOutcome]] = frozenset({ACK, NACK})
# Outcomes whose name is their own failure reason (``state.reason_of``).
SELF_DESCRIBED: Final[frozenset[PushOutcome]] = frozenset({TIMEOUT, EXPIRED})
