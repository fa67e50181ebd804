"""deltabus errors -> gRPC status codes, as Pub/Sub answers them.

A pure mapping (no grpc calls): ``status_of(exc)`` gives the code and the message a call
aborts with. The clients decide on the code whether to retry (FACTS.md: Publish retries
ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED, ...; Acknowledge and ModifyAckDeadline only
UNAVAILABLE), so the code must say what happened:

- InvalidArgument -> INVALID_ARGUMENT, "FIELD: RULE" (the field is always named);
- NotFound (a topic, a subscription) -> NOT_FOUND; AlreadyExists -> ALREADY_EXISTS;
- FailedPrecondition (pull on a push subscription, an unfinished move) -> FAILED_PRECONDITION;
- Aborted (a commit that kept conflicting; nothing written) -> ABORTED (retryable);
- a timeout -> DEADLINE_EXCEEDED; Cancelled/ClientClosed (the server is stopping) and storage
  that cannot be reached (OSError) -> UNAVAILABLE;
- anything else -> INTERNAL, with the exception's type only: payloads never reach a message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import NamedTuple

import grpc

from ..errors import AlreadyExists, Aborted, Cancelled, FailedPrecondition, InvalidArgument, NotFound


class Status(NamedTuple):
    code: grpc.StatusCode
    message: str


def status_of(exc: BaseException) -> Status:
    """The status a call that raised `exc` ends with."""
    if isinstance(exc, InvalidArgument):
        return Status(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc.rule}")
    if isinstance(exc, NotFound):
        return Status(grpc.StatusCode.NOT_FOUND, f"Resource not found ({exc.kind}={exc.name})")
    if isinstance(exc, AlreadyExists):
        return Status(grpc.StatusCode.ALREADY_EXISTS, f"Resource already exists in the project ({exc.kind}={exc.name})")
    if isinstance(exc, FailedPrecondition):
        return Status(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, Aborted):
        return Status(grpc.StatusCode.ABORTED, f"{exc} (nothing was written; retry)")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)):
        return Status(grpc.StatusCode.DEADLINE_EXCEEDED, "the call ran out of time")
    if isinstance(exc, Cancelled):
        return Status(grpc.StatusCode.UNAVAILABLE, f"{exc}")
    if isinstance(exc, OSError):
        return Status(grpc.StatusCode.UNAVAILABLE, f"storage unavailable ({type(exc).__name__}); retry")
    return Status(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})")
