"""deltabus errors -> gRPC status codes, as Pub/Sub answers them.

A pure mapping (no grpc calls): ``status_of(exc)`` gives the code and the message a call
aborts with. The clients decide on the code whether to retry (FACTS.md: Publish retries
ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED, ...; Acknowledge and ModifyAckDeadline only
UNAVAILABLE), so the code must say what happened:

- InvalidArgument -> INVALID_ARGUMENT, "FIELD: RULE" (the field is always named);
- NotFound (a topic, a subscription) -> NOT_FOUND; AlreadyExists -> ALREADY_EXISTS;
- FailedPrecondition (pull on a push subscription, an unfinished move) -> FAILED_PRECONDITION;
- Aborted (a commit that kept conflicting; nothing written) -> ABORTED (retryable);
- a timeout -> DEADLINE_EXCEEDED; Cancelled/ClientClosed (the server is stopping), storage
  that cannot be reached (OSError) and ClockUncertain (a lease refused while the server's
  storage clock is known too loosely, issue 16) -> UNAVAILABLE; StorageFull (a full
  disk) -> UNAVAILABLE with its message (the path, and "free space ... then retry");
- AcknowledgeError with ``failed`` ack ids (exactly-once, issue 15: an Acknowledge or
  ModifyAckDeadline whose other ids applied) -> INVALID_ARGUMENT, as Pub/Sub answers it, with
  the rich status (``details``) the clients read per ack id: a ``google.rpc.Status`` of the
  same code and message whose one detail is an ``ErrorInfo`` (reason
  EXACTLY_ONCE_ACKID_FAILURE, domain pubsub.googleapis.com, metadata {ack id:
  "PERMANENT_FAILURE_INVALID_ACK_ID"}). google-cloud-pubsub reads it with
  ``grpc_status.rpc_status.from_call`` (which refuses a status whose code or message differ
  from the call's) and counts an id missing from the metadata as applied;
- anything else -> INTERNAL, with the exception's type only: payloads never reach a message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import NamedTuple

import grpc
from google.rpc import error_details_pb2, status_pb2

from ..errors import (AcknowledgeError, AcknowledgeStatus, AlreadyExists, Aborted, Cancelled, ClockUncertain, FailedPrecondition, StorageFull,
                      InvalidArgument, NotFound)

# The trailing metadata key of the rich status (grpc_status.rpc_status's GRPC_DETAILS_METADATA_KEY).
DETAILS_KEY = "grpc-status-details-bin"
ACK_FAILURE_REASON = "EXACTLY_ONCE_ACKID_FAILURE"
ACK_FAILURE_DOMAIN = "pubsub.googleapis.com"
ACK_FAILURE_MESSAGE = ("Some acknowledgement ids in the request were invalid. This could be because the acknowledgement"
                       " ids have expired or the acknowledgement ids were malformed.")
# Pub/Sub's per-ack-id failure values (google-cloud-pubsub retries the TRANSIENT_ ones).
_ACK_FAILURES = {AcknowledgeStatus.INVALID_ACK_ID: "PERMANENT_FAILURE_INVALID_ACK_ID"}


class Status(NamedTuple):
    code: grpc.StatusCode
    message: str
    # A serialized google.rpc.Status to send as DETAILS_KEY trailing metadata (empty: none).
    details: bytes = b""


def ack_failure_details(code: grpc.StatusCode, message: str, failed: dict[str, AcknowledgeStatus]) -> bytes:
    """The rich status of an exactly-once ack failure: `code` and `message` as the call's,
    one ErrorInfo naming each failed ack id (``PERMANENT_FAILURE_<STATUS>``)."""
    info = error_details_pb2.ErrorInfo(
        reason=ACK_FAILURE_REASON, domain=ACK_FAILURE_DOMAIN,
        metadata={a: _ACK_FAILURES.get(s, f"PERMANENT_FAILURE_{s.value}") for a, s in failed.items()},
    )
    rich = status_pb2.Status(code=code.value[0], message=message)
    rich.details.add().Pack(info)
    return rich.SerializeToString()


def status_of(exc: BaseException) -> Status:
    """The status a call that raised `exc` ends with."""
    if isinstance(exc, AcknowledgeError):
        code = grpc.StatusCode.INVALID_ARGUMENT
        if not exc.failed:
            return Status(code, str(exc))
        return Status(code, ACK_FAILURE_MESSAGE, ack_failure_details(code, ACK_FAILURE_MESSAGE, exc.failed))
    if isinstance(exc, InvalidArgument):
        return Status(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc.rule}")
    if isinstance(exc, NotFound):
        return Status(grpc.StatusCode.NOT_FOUND, f"Resource not found ({exc.kind}={exc.name})")
    if isinstance(exc, AlreadyExists):
        return Status(grpc.StatusCode.ALREADY_EXISTS, f"Resource already exists in the project ({exc.kind}={exc.name})")
    if isinstance(exc, ClockUncertain):  # the server's storage clock cannot be trusted yet: retryable
        return Status(grpc.StatusCode.UNAVAILABLE, f"{exc}; retry")
    if isinstance(exc, FailedPrecondition):
        return Status(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, Aborted):
        return Status(grpc.StatusCode.ABORTED, f"{exc} (nothing was written; retry)")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)):
        return Status(grpc.StatusCode.DEADLINE_EXCEEDED, "the call ran out of time")
    if isinstance(exc, Cancelled):
        return Status(grpc.StatusCode.UNAVAILABLE, f"{exc}")
    if isinstance(exc, StorageFull):  # names the path and the fix; retryable once space is freed
        return Status(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, OSError):
        return Status(grpc.StatusCode.UNAVAILABLE, f"storage unavailable ({type(exc).__name__}); retry")
    return Status(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})")
