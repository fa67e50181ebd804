"""What the server's two group commits share (``group_commit``: leases and outcomes of a
subscription; ``publish_commit``: appends of publishes): running one round's blocking work
off the event loop, and handing each caller of the round its answer.

Contract: ``run_off_loop`` runs the round on the executor; an executor already shut down
(the server is stopping) becomes ``Cancelled``, which callers see as UNAVAILABLE and retry.
``fail_all`` gives every caller of a round that raised the round's error (nothing of that
caller's work was written; a caller answered before the round ended, as a group-commit
round's lease callers after its leases' commit, keeps its answer). ``settle`` gives each caller its own answer, an Exception answer as the
future's exception. A future already done (its caller gone) is left alone. Event-loop only.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Any, Callable, Iterable, Protocol, Sequence, TypeVar

from ..errors import Cancelled

T = TypeVar("T")


class Waiting(Protocol):
    """A caller waiting on a round: the NamedTuples of both group commits."""

    @property
    def future(self) -> asyncio.Future[Any]: ...


async def run_off_loop(executor: Executor | None, fn: Callable[..., list[T]], *args: Any) -> list[T]:
    """`fn(*args)` on `executor` (None: the loop's default), awaited (see the module docstring)."""
    try:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    except RuntimeError as exc:  # the pool was shut down: the server is stopping (UNAVAILABLE: retry)
        if "shutdown" not in str(exc):
            raise
        raise Cancelled("the server is stopping; retry") from exc


def fail_all(batch: Iterable[Waiting], exc: BaseException) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(exc)


def settle(batch: Sequence[Waiting], answers: Sequence[Any]) -> None:
    for p, a in zip(batch, answers):
        if p.future.done():
            continue
        if isinstance(a, Exception):
            p.future.set_exception(a)
        else:
            p.future.set_result(a)
