"""A push worker: a long-lived task on an executor that POSTs whatever the driver hands it.

The push job starts ``workers`` of these as one Spark job (``PushPool``) and keeps them for
its whole run, so a delivery costs no Spark job, no task launch and no new connection
pool. Each worker:

* asks the driver for work (``POST /work``, a long poll) whenever it holds less than
  ``per_sub`` rows of some subscription, saying how many it holds of each;
* POSTs each request with up to ``concurrency`` requests open per subscription, so an
  endpoint that hangs until its ack deadline only ever holds up its own subscription;
* reports outcomes (``POST /outcomes``) every ``report_every`` seconds while it has any.

A worker stops when the driver answers 410 (the job is stopping; it finishes what it holds
first) or when the driver has been unreachable for ``orphan_after`` seconds (the job died:
what it held is leased in Delta and comes back when the leases expire).

Over ``https://`` the worker pins the pool's per-run certificate (``pool_tls.CertPin``):
aiohttp checks the server's certificate against the pin after the handshake and before it
writes a request, so a server presenting any other certificate never sees the run key.
Such a server is not the driver: the worker stops at once, like an orphan, without
retrying. Nothing here logs a token or a payload.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
import uuid
from typing import Any, Callable, Iterator

import aiohttp
import pyarrow as pa

from ..errors import InvalidArgument
from .outcome import ERROR, EXPIRED, PushOutcome
from .pool_tls import CertPin
from .sender import MAX_CONCURRENCY, Request, push_session, requests_of, send
from .wire import AUTH_HEADER, PENDING_HEADER, RESULT_SCHEMA, WORK_SCHEMA, WORKER_HEADER, from_ipc, to_ipc

log = logging.getLogger(__name__)

PER_SUB_ROWS = 512  # rows a worker holds per subscription (queued + being sent)
REPORT_EVERY = 0.02
RECHECK = 0.1  # seconds between asks for work while busy and nothing came
ORPHAN_AFTER = 30.0


def control_ssl(url: str, pin: CertPin | None) -> aiohttp.Fingerprint | None:
    """How a worker checks the pool at `url`: the pin for ``https://``, nothing for ``http://``.
    Raises InvalidArgument (naming ``pin`` or ``url``) for any other pairing."""
    if url.startswith("https://"):
        if pin is None:
            raise InvalidArgument("pin", "an https:// pool needs the certificate pin its driver made for the run")
        if len(pin.sha256) != 32:
            raise InvalidArgument("pin", f"must be a SHA-256 (32 bytes), got {len(pin.sha256)} bytes")
        return aiohttp.Fingerprint(pin.sha256)
    if url.startswith("http://"):
        if pin is not None:
            raise InvalidArgument("pin", "a plain http:// pool has no certificate to pin")
        return None
    raise InvalidArgument("url", f"must start with http:// or https://, got {url!r}")


class _Sub:
    """One subscription's pushes in a worker: a queue and up to `concurrency` senders on it."""

    __slots__ = ("queue", "wake", "held", "senders")

    def __init__(self) -> None:
        self.queue: collections.deque[tuple[Request, int]] = collections.deque()  # (request, assignment)
        self.wake = asyncio.Event()
        self.held = 0  # queued + being sent
        self.senders: list[asyncio.Task[None]] = []


class Worker:
    """One push worker talking to the pool at `url` with the run's `key`.

    `pin` is required for an ``https://`` pool and refused for an ``http://`` one (aiohttp
    skips a pin on a plain connection, so accepting both would silently drop it):
    InvalidArgument names the field."""

    def __init__(
        self,
        url: str,
        key: str,
        *,
        pin: CertPin | None = None,
        concurrency: int = MAX_CONCURRENCY,
        per_sub: int = PER_SUB_ROWS,
        report_every: float = REPORT_EVERY,
        orphan_after: float = ORPHAN_AFTER,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self._control_ssl = control_ssl(self.url, pin)
        self._wall = wall
        self.id = uuid.uuid4().hex
        self._headers = {AUTH_HEADER: key, WORKER_HEADER: self.id}
        self.concurrency = concurrency
        self.per_sub = per_sub
        self.low_water = per_sub // 2  # ask for more of a subscription once down to this
        self.report_every = report_every
        self.orphan_after = orphan_after
        self._clock = clock
        self._subs: dict[str, _Sub] = {}
        self._outbox: list[tuple[Any, ...]] = []  # RESULT_SCHEMA rows
        self._room = asyncio.Event()  # set when some subscription dropped below per_sub
        self._stopping = False
        self._impostor = False  # the server at url presented a certificate other than the pin
        self._last_contact = clock()
        self.pushed = 0

    # -- sending ----------------------------------------------------------------------
    def _take(self, table: pa.Table) -> None:
        assignments = table.column("assignment").to_pylist()
        for req, aid in zip(requests_of(table), assignments):
            sub = self._subs.get(req.sub_uid)
            if sub is None:
                sub = self._subs[req.sub_uid] = _Sub()
            sub.queue.append((req, aid))
            sub.held += 1
        for uid, sub in self._subs.items():
            while sub.queue and len(sub.senders) < min(self.concurrency, sub.held):
                sub.senders.append(asyncio.get_running_loop().create_task(self._sender(sub)))
            if sub.queue:
                sub.wake.set()

    async def _sender(self, sub: _Sub) -> None:
        """Lives as long as the worker: sends the subscription's next request, or waits for one."""
        queue = sub.queue
        while True:
            if not queue:
                sub.wake.clear()
                await sub.wake.wait()
                continue
            req, aid = queue.popleft()
            if req.lease_expires is not None and self._wall() >= req.lease_expires:
                # Waited here past its lease (a slow endpoint, a full worker): the message is
                # due again under a new attempt, so sending this one would push it twice.
                status, outcome, latency, error = 0, EXPIRED, 0.0, ""
            else:
                status, outcome, latency, error = await self._send(req)
            # self._outbox, not a local: the report loop swaps in a new list.
            self._outbox.append((req.sub_uid, req.message_id, req.delivery_attempt, status, outcome, latency, error, aid))
            sub.held -= 1
            self.pushed += outcome != EXPIRED
            if sub.held == self.low_water or sub.held == 0:
                self._room.set()

    async def _send(self, req: Request) -> tuple[int, PushOutcome, float, str]:
        try:
            return await send(self._session, req)
        except Exception as exc:  # a bug, not the endpoint: report it as failed, keep going
            log.error("push worker: sending failed unexpectedly: %s", type(exc).__name__)
            return 0, ERROR, 0.0, "error"

    @property
    def busy(self) -> bool:
        return any(s.held for s in self._subs.values())

    def _hungry(self) -> bool:
        """Holds nothing, or some subscription is down to its low water."""
        return not self.busy or any(s.held <= self.low_water for s in self._subs.values())

    # -- talking to the driver ----------------------------------------------------------
    def _orphaned(self) -> bool:
        return self._impostor or self._clock() - self._last_contact > self.orphan_after

    def _refuse(self, exc: aiohttp.ServerFingerprintMismatch) -> None:
        if not self._impostor:
            log.error(
                "push worker %s: the server at %s presented a certificate other than the pinned one "
                "(SHA-256 %s); stopping without sending it anything",
                self.id, self.url, exc.got.hex(":").upper(),
            )
        self._impostor = True

    async def _wait_room(self, timeout: float) -> None:
        self._room.clear()
        try:
            await asyncio.wait_for(self._room.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _fetch_loop(self) -> None:
        """Ask for work when hungry. Each subscription is topped up to per_sub only once it
        is down to half that, so a busy worker asks a few times a second, not per push."""
        while not self._stopping and not self._orphaned():
            if not self._hungry():
                # Wake at a low-water crossing; or after RECHECK, to pick up new subscriptions' work.
                await self._wait_room(RECHECK)
            pending = json.dumps({u: s.held for u, s in self._subs.items() if s.held})
            try:
                async with self._control.post(f"{self.url}/work", headers={**self._headers, PENDING_HEADER: pending}) as resp:
                    body = await resp.read()
                    status = resp.status
            except aiohttp.ServerFingerprintMismatch as exc:
                self._refuse(exc)
                return
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.5)
                continue
            self._last_contact = self._clock()
            if status == 200:
                self._take(from_ipc(body, WORK_SCHEMA))
            elif status == 410:
                self._stopping = True
            elif status != 204:
                log.error("the push job's driver answered %d to a worker; stopping", status)
                self._stopping = True
            elif self.busy:
                # Nothing for us now. The driver long-polls only idle workers, so wait here.
                await self._wait_room(RECHECK)

    async def _report_loop(self) -> None:
        while True:
            done = self._stopping and not self.busy and not self._outbox
            if done or self._orphaned():
                return
            if self._outbox:
                rows, self._outbox = self._outbox, []
                columns = list(zip(*rows))
                body = to_ipc(pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, RESULT_SCHEMA)], schema=RESULT_SCHEMA))
                try:
                    async with self._control.post(f"{self.url}/outcomes", data=body, headers=self._headers) as resp:
                        await resp.read()
                        ok = resp.status == 204
                except aiohttp.ServerFingerprintMismatch as exc:
                    self._refuse(exc)
                    ok = False
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    ok = False
                if ok:
                    self._last_contact = self._clock()
                else:
                    self._outbox[:0] = rows  # try again; the driver gives them up if it never hears
                    await asyncio.sleep(0.5)
                    continue
            await asyncio.sleep(self.report_every)

    async def run(self) -> int:
        """Work until stopped or orphaned; the number of pushes made."""
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        control = aiohttp.TCPConnector(ssl=self._control_ssl if self._control_ssl is not None else True)
        async with push_session(connector) as self._session, aiohttp.ClientSession(
            connector=control, timeout=aiohttp.ClientTimeout(total=60)
        ) as self._control:
            fetch = asyncio.create_task(self._fetch_loop())
            try:
                await self._report_loop()
            finally:
                tasks = [fetch, *(t for s in self._subs.values() for t in s.senders)]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        if self._orphaned() and not self._impostor:
            held = sum(s.held for s in self._subs.values())
            log.error("push worker %s lost its driver; %d pushes it held are left to their lease deadlines", self.id, held)
        return self.pushed


def pool_partition(
    url: str, key: str, concurrency: int = MAX_CONCURRENCY, *, pin: CertPin | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow body of the pool's Spark job: each task is one worker. `key` and `pin`
    reach the executors inside this closure (Spark ships it with the task)."""
    control_ssl(url, pin)  # a bad url/pin pair fails here, on the driver, not in every task

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:  # one row per task: which worker it is does not matter
            pass
        worker = Worker(url, key, pin=pin, concurrency=concurrency)
        pushed = asyncio.run(worker.run())
        yield pa.RecordBatch.from_pydict({"worker": [worker.id], "pushed": [pushed]})

    return run
