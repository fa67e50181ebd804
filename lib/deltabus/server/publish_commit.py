"""Group commit for Publish: the messages of every Publish request that arrives while an
append runs go into the messages table in ONE append.

Contract.

- ``PublishCommits.publish(topic, messages)`` takes a request's validated messages (the
  caller checks names and messages first: a bad request writes nothing and never joins a
  round) and returns their ids in order once they are committed.
- **Rounds.** One queue for the whole server (all topics share the messages table, and
  concurrent appends only race for its next version). While no round runs, a request
  starts one at once; while one runs, requests queue, and the next round takes every
  queued request (at most ``MAX_ROUND_MESSAGES`` messages / ``MAX_ROUND_BYTES`` bytes;
  the rest waits for the round after). A round runs on the executor given (a thread of
  its own), never on the event loop.
- **A request stays atomic.** Its rows are built as one batch (one publish time, one id
  prefix: ``publisher.rows.build_rows``) and committed in the round's single append, so
  either all of a request's messages are written or none. Requests of a round get strictly
  increasing publish times in arrival order, so their ids sort in arrival order too (a
  client publishing an ordering key sends its next batch only after the previous one's
  answer, so one key never has two requests in one round anyway). A request whose topic
  does not exist (any more) fails alone with NotFound; a failing append fails every
  request of the round with the same error (nothing of them was written: an append that
  fails leaves no log entry). The committed rows go to the server's ``PayloadCache``.

Why (measured here, google-cloud-pubsub publishing 500 msg/s with default batching, i.e.
~50 Publish requests of ~10 messages a second, against ``deltabus serve`` with one
subscribe() client): with one append per request on the shared thread pool, 16 appends
raced for each messages-table version; an append took p50 ~1 s (up to 10 s), the server
committed ~10 requests a second, the pool's queue of Publish calls grew without bound
(a request waited 2 s, 5 s, ... 22 s before its append started) and publish -> callback
latency reached p50 ~27 s. The ~50 one-request versions a second also made every
StreamingPull fan-out read ~50 change-feed versions (~400 ms) and the payload read open
~50 small files per round.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Callable, NamedTuple, Sequence

import pyarrow as pa

from ..errors import NotFound
from ..publisher.rows import OutgoingMessage, build_rows
from ..registry import Registry
from ..storage import Engine, Snapshot
from ..storage.tables import MESSAGES
from ..timestamps import US_PER_SECOND, to_us
from .own_commits import OwnCommits
from .payload_cache import PayloadCache
from .rounds import fail_all, run_off_loop, settle

# A round's size bounds (one append): beyond them the remaining requests wait for the next round.
MAX_ROUND_MESSAGES = 50_000
MAX_ROUND_BYTES = 64 * 1024 * 1024


class _Pending(NamedTuple):
    topic: str
    messages: Sequence[OutgoingMessage]
    nbytes: int
    future: asyncio.Future[list[str]]


def take_round(queue: list[_Pending], max_messages: int = MAX_ROUND_MESSAGES, max_bytes: int = MAX_ROUND_BYTES) -> int:
    """How many leading requests of `queue` one round takes (at least one). Pure."""
    n = count = size = 0
    for p in queue:
        if n and (count + len(p.messages) > max_messages or size + p.nbytes > max_bytes):
            break
        n += 1
        count += len(p.messages)
        size += p.nbytes
    return n


def run_round(
    engine: Engine,
    registry: Registry,
    requests: Sequence[tuple[str, Sequence[OutgoingMessage]]],
    clock: Callable[[], float],
    cache: PayloadCache | None = None,
    own: OwnCommits | None = None,
) -> list[list[str] | Exception]:
    """Append the messages of `requests` (topic name, messages) in one commit; return each
    request's ids, or the error that fails it alone (its topic is gone). Blocking. An
    append error is raised (it fails the whole round). `own`: where the version the append
    wrote is recorded with its rows (the group commit's fan-out reads them from there)."""
    topics = registry.topics()
    out: list[list[str] | Exception] = []
    tables: list[pa.Table] = []
    last = -1
    for name, messages in requests:
        rec = topics.get(name)
        if rec is None:  # deleted (or never created): this request alone fails
            out.append(NotFound("topic", name))
            continue
        last = max(to_us(clock()), last + 1)  # strictly increasing whole us: ids sort in arrival order
        rows, ids = build_rows(rec.topic_uid, rec.name, messages, last / US_PER_SECOND)
        tables.append(rows)
        out.append(ids)
    if tables:
        rows = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        version = append(engine, rows)
        if own is not None and version is not None:
            own.put(version, rows)
        if cache is not None:  # committed: the rounds that lease them need not read them back
            cache.put(rows)
    return out


def append(engine: Engine, rows: pa.Table) -> int | None:
    """Append `rows` to the messages table (a blind append: only a lost version race reruns
    it) and return the version it wrote (None when the engine does not tell)."""

    def attempt(snap: Snapshot) -> int | None:
        snap.append(rows)
        return getattr(snap, "committed_version", None)

    return engine.transact(MESSAGES.name, attempt, what="append to messages")


class PublishCommits:
    """The server's Publish group commit (see the module docstring). Call ``publish`` on the
    event loop; rounds run on `executor`."""

    def __init__(
        self, engine: Engine, registry: Registry, clock: Callable[[], float], *, executor: Executor, cache: PayloadCache | None = None,
        own: OwnCommits | None = None,
    ) -> None:
        self._cache = cache
        self._own = own
        self._engine = engine
        self._registry = registry
        self._clock = clock
        self._executor = executor
        self._queue: list[_Pending] = []
        self._running: asyncio.Task[None] | None = None
        self.rounds = 0  # appends made (a test compares them with the requests)
        self.requests = 0

    async def publish(self, topic: str, messages: Sequence[OutgoingMessage]) -> list[str]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[str]] = loop.create_future()
        self._queue.append(_Pending(topic, messages, sum(m.size for m in messages), fut))
        self.requests += 1
        if self._running is None:
            self._running = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                n = take_round(self._queue)
                batch, self._queue = self._queue[:n], self._queue[n:]
                batch = [p for p in batch if not p.future.cancelled()]
                if not batch:
                    continue
                self.rounds += 1
                try:
                    answers = await run_off_loop(
                        self._executor, run_round, self._engine, self._registry, [(p.topic, p.messages) for p in batch], self._clock,
                        self._cache, self._own,
                    )
                except Exception as exc:  # nothing of the round was written: every request fails with it
                    fail_all(batch, exc)
                    continue
                settle(batch, answers)
        finally:
            self._running = None
            if self._queue:  # raced in after the loop test
                self._running = loop.create_task(self._drain())
