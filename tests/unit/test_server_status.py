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
