"""The chaos suite's push endpoint: misbehaving on purpose, and recording every answer it gave.

It runs in a process of its own (spawned) on 127.0.0.1 and serves one path per behaviour
(``BEHAVIOURS``). What it records is the endpoint's own truth, which the suite's invariants
are checked against (never deltabus's tables alone): one JSON line per request in
``<dir>/requests.jsonl`` with the subscription, message id, arrival time, the time the answer
was complete (or gave up), the status sent, and whether it was a clean answer.

Contract.

- **Deterministic progress.** A behaviour misbehaves only on a message's first ``BAD_TRIES``
  arrivals at that path (the endpoint counts them itself), with the behaviour's probability
  from a seeded generator; later arrivals get 204. So every scenario can finish, and a
  message that never gets a 2xx is a real loss, not the endpoint's doing.
- **Clean vs ambiguous acks.** A 2xx whose response was complete within ``deadline`` - 1
  seconds of the request's arrival is ``clean``: the pusher saw it (the invariant "no
  message acked and then redelivered without a crash" is checked against these). A 2xx
  status whose body was still dripping or streaming past the deadline is ``ambiguous``:
  the pusher may have taken the status or timed out, so it counts for "acked at least once"
  but is never held against a redelivery.
- ``refuse``: the behaviour's port accepts connections only ``refuse_seconds`` after start
  (connection refused until then), then answers 204.
- Requests carry the subscription in the push body (``subscription``) and the message id
  (``message.messageId``), as Pub/Sub's push body does.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

Behaviour = Literal["ok", "flaky", "held", "drip", "huge", "refuse"]
BEHAVIOURS: tuple[Behaviour, ...] = get_args(Behaviour)
BAD_TRIES = 3  # a message misbehaves at most on its first BAD_TRIES arrivals
# The probability each behaviour misbehaves on one of those arrivals.
ODDS: dict[Behaviour, float] = {"ok": 0.0, "flaky": 0.5, "held": 0.05, "drip": 0.02, "huge": 0.01, "refuse": 0.0}
HUGE_BYTES = 64 * 1024 * 1024  # a 2xx body this large, streamed: a pusher must not read it into memory


@dataclass(frozen=True, slots=True)
class EndpointSettings:
    deadline: float  # the subscriptions' ack deadline (push timeout), seconds
    refuse_seconds: float = 60.0
    seed: int = 1
    flaky_odds: float = ODDS["flaky"]  # the 50% 500s; a short test may ask for fewer

    def __post_init__(self) -> None:
        if not self.deadline > 0:
            raise ValueError(f"deadline: must be > 0 seconds, got {self.deadline!r}")
        if not 0 <= self.flaky_odds <= 1:
            raise ValueError(f"flaky_odds: must be 0..1, got {self.flaky_odds!r}")
        if self.refuse_seconds < 0:
            raise ValueError(f"refuse_seconds: must be >= 0, got {self.refuse_seconds!r}")


def _serve(out_dir: str, settings: EndpointSettings, ports: Any) -> None:  # pragma: no cover - child process
    import asyncio
    import random

    from aiohttp import web

    rng = random.Random(settings.seed)
    odds = {**ODDS, "flaky": settings.flaky_odds}
    seen: dict[tuple[str, str, str], int] = {}
    log = open(Path(out_dir) / "requests.jsonl", "a", buffering=1 << 16)

    # Each distinct bearer token once (the pusher reuses a token until near its expiry), so a
    # test can grep the job's log for them without a token on every request line.
    tokens_seen: set[str] = set()
    tokens = open(Path(out_dir) / "tokens.txt", "a", buffering=1)

    def record(**fields: Any) -> None:
        log.write(json.dumps(fields, separators=(",", ":")) + "\n")

    def note_token(request: Any) -> None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token and token not in tokens_seen:
            tokens_seen.add(token)
            tokens.write(token + "\n")

    def handler(kind: Behaviour) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            t0 = time.time()
            note_token(request)
            body = json.loads(await request.read())
            sub, mid = body.get("subscription", ""), body["message"]["messageId"]
            n = seen.get((kind, sub, mid), 0)
            seen[(kind, sub, mid)] = n + 1
            bad = n < BAD_TRIES and rng.random() < odds[kind]
            base = {"sub": sub, "m": mid, "path": kind, "t0": round(t0, 4)}
            if not bad:
                record(**base, t1=round(time.time(), 4), st=204, clean=True)
                return web.Response(status=204)
            if kind == "flaky":
                record(**base, t1=round(time.time(), 4), st=500, clean=True)
                return web.Response(status=500)
            if kind == "held":  # answered only after the pusher gave up
                try:
                    await asyncio.sleep(settings.deadline + 2)
                except asyncio.CancelledError:  # the pusher closed the connection first: no answer went out
                    record(**base, t1=round(time.time(), 4), st=0, clean=True)
                    raise
                record(**base, t1=round(time.time(), 4), st=204, clean=False)
                return web.Response(status=204)
            resp = web.StreamResponse(status=200)
            resp.content_length = HUGE_BYTES if kind == "huge" else 64
            ok = True
            try:
                await resp.prepare(request)
                if kind == "drip":  # the status at once, then a byte every half second past the deadline
                    for _ in range(int((settings.deadline + 2) * 2)):
                        await resp.write(b"x")
                        await asyncio.sleep(0.5)
                else:
                    chunk = b"h" * (1 << 20)
                    for _ in range(HUGE_BYTES // len(chunk)):
                        await resp.write(chunk)
                await resp.write_eof()
            except (ConnectionError, asyncio.CancelledError, RuntimeError):
                ok = False  # the pusher closed the connection (it had the status)
            t1 = time.time()
            # Clean only with a second's margin: the pusher's timer started before our arrival time.
            record(**base, t1=round(t1, 4), st=200, clean=ok and t1 - t0 <= settings.deadline - 1, body_done=ok)
            return resp

        return handle

    async def main() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for kind in BEHAVIOURS:
            if kind != "refuse":
                app.router.add_route("POST", f"/{kind}", handler(kind))
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        main_port = runner.addresses[0][1]
        # The refusing port: reserved now (so its number is known), listening only later.
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        refuse_port = s.getsockname()[1]
        s.close()
        ports.put((main_port, refuse_port))

        async def flush() -> None:
            while True:
                await asyncio.sleep(0.5)
                log.flush()

        flusher = asyncio.get_running_loop().create_task(flush())  # from the start, refusing or not
        late = web.Application(client_max_size=64 * 1024 * 1024)
        late.router.add_route("POST", "/refuse", handler("refuse"))
        late_runner = web.AppRunner(late, access_log=None)
        await late_runner.setup()
        await asyncio.sleep(settings.refuse_seconds)
        await web.TCPSite(late_runner, "127.0.0.1", refuse_port, backlog=4096).start()
        await flusher

    asyncio.run(main())


class ChaosEndpoint:
    """The endpoint process; ``url(kind)`` is a behaviour's URL; ``records()`` reads what it
    answered so far (flushed every half second)."""

    def __init__(self, out_dir: Path, settings: EndpointSettings) -> None:
        self.out_dir = out_dir
        self.settings = settings

    def __enter__(self) -> "ChaosEndpoint":
        self.out_dir.mkdir(parents=True, exist_ok=True)
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        self._proc = ctx.Process(target=_serve, args=(str(self.out_dir), self.settings, q), daemon=True)
        self._proc.start()
        self.port, self.refuse_port = q.get(timeout=60)
        self.started = time.time()
        return self

    def url(self, kind: Behaviour) -> str:
        port = self.refuse_port if kind == "refuse" else self.port
        return f"http://127.0.0.1:{port}/{kind}"

    def tokens(self) -> set[str]:
        """Every distinct bearer token the endpoint was sent."""
        path = self.out_dir / "tokens.txt"
        return set(path.read_text().split()) if path.exists() else set()

    def records(self) -> list[dict[str, Any]]:
        path = self.out_dir / "requests.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line being written
                pass
        return out

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.join(10)
