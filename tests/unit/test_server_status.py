"""status_of: each deltabus error gets the status code Pub/Sub answers with."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from deltabus.errors import AlreadyExists, Aborted, ClientClosed, FailedPrecondition, InvalidArgument, NotFound, WarehouseNotFound
from deltabus.server.status import status_of
from deltabus.storage.keyed_steps import UnfinishedMove

C = grpc.StatusCode


def test_invalid_argument_names_the_field() -> None:
    s = status_of(InvalidArgument("messages[0].attributes", "at most 100 attributes, got 101"))
    assert s.code is C.INVALID_ARGUMENT
    assert s.message == "messages[0].attributes: at most 100 attributes, got 101"


@pytest.mark.parametrize(
    "exc, code",
    [
        (NotFound("topic", "projects/p/topics/t"), C.NOT_FOUND),
        (WarehouseNotFound("/x"), C.NOT_FOUND),
        (AlreadyExists("subscription", "projects/p/subscriptions/s"), C.ALREADY_EXISTS),
        (FailedPrecondition("a push subscription"), C.FAILED_PRECONDITION),
        (UnfinishedMove("deliveries", "s1", [3]), C.FAILED_PRECONDITION),
        (Aborted("gave up after 5 conflicting attempts"), C.ABORTED),
        (TimeoutError(), C.DEADLINE_EXCEEDED),
        (asyncio.TimeoutError(), C.DEADLINE_EXCEEDED),
        (ClientClosed("closed"), C.UNAVAILABLE),
        (ConnectionRefusedError(), C.UNAVAILABLE),
        (RuntimeError("boom"), C.INTERNAL),
    ],
)
def test_codes(exc: BaseException, code: grpc.StatusCode) -> None:
    assert status_of(exc).code is code


def test_not_found_names_the_resource() -> None:
    assert "projects/p/topics/t" in status_of(NotFound("topic", "projects/p/topics/t")).message


def test_internal_errors_do_not_carry_their_text() -> None:
    """An unexpected error's text may hold a payload: only its type reaches the client."""
    s = status_of(ValueError("secret-payload-bytes"))
    assert "secret" not in s.message and "ValueError" in s.message


def test_exactly_once_ack_failures_carry_a_rich_status() -> None:
    """INVALID_ARGUMENT with a google.rpc.Status of the same code and message whose one detail
    is the ErrorInfo google-cloud-pubsub reads per ack id."""
    from google.rpc import error_details_pb2, status_pb2

    from deltabus.errors import AcknowledgeError, AcknowledgeStatus

    failed = {"u.1.2.3": AcknowledgeStatus.INVALID_ACK_ID, "u.4.1.5": AcknowledgeStatus.INVALID_ACK_ID}
    s = status_of(AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, "2 of 3", failed))
    assert s.code is C.INVALID_ARGUMENT
    rich = status_pb2.Status.FromString(s.details)
    assert (rich.code, rich.message) == (C.INVALID_ARGUMENT.value[0], s.message)  # else the client drops it
    assert len(rich.details) == 1
    info = error_details_pb2.ErrorInfo()
    assert rich.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("EXACTLY_ONCE_ACKID_FAILURE", "pubsub.googleapis.com")
    assert dict(info.metadata) == {"u.1.2.3": "PERMANENT_FAILURE_INVALID_ACK_ID", "u.4.1.5": "PERMANENT_FAILURE_INVALID_ACK_ID"}
    # without failed ids (not a per-id answer): a plain status
    assert status_of(AcknowledgeError(AcknowledgeStatus.OTHER, "x")).details == b""
    assert status_of(InvalidArgument("ack_ids[0]", "bad")).details == b""
