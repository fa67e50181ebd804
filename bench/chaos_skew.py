"""Clock skew (issue 16, scenario 4): pullers whose wall clocks are off, on one subscription.

    .venv/bin/python bench/chaos_skew.py [--messages 2000] [--skew 30] [--no-correction]

``run(scratch, messages, skew_seconds)`` publishes `messages` messages to one pull
subscription (ack deadline 10 s) and drains it with three pullers, each a
``SubscriberClient`` in its own thread whose injected wall clock (``clock=``) is off by
+skew, -skew and 0 seconds. With ``correct`` (the default) each client also gets
``clock_skew=ClockSkewPolicy()``, the bound under test: lease arithmetic on storage time
(``deltabus.storage.clock.StorageClock``). Every puller acks what it receives at once,
except that it abandons (never acks) the first delivery of one message in
``abandon_every``: its lease must run out, and then the message must come again once.

The figures come from the pullers' own records, in true time (this machine's real clock,
which is also the storage's: the warehouse is on a local disk), never from deltabus's tables:

- ``leases_granted_twice``: a lease decided while an earlier lease of the same message was
  still running in true time. A lease runs from the true moment its pull read its clock
  (recorded exactly: the decision is wrapped, see ``_Recorder``) for the ack deadline,
  unless its holder acked it first. Zero is the guarantee.
- ``acked_redelivered``: messages delivered again after a delivery its holder acked (the
  ack was sent at once, inside the holder's lease): no crash happens here, so zero is the
  guarantee. ``stale_acks`` counts the acks that then did nothing.
- ``duplicates``: deliveries beyond one per message plus one per abandoned lease.
- ``lost``: messages the subscription still holds at the end, or never delivered.
- ``offsets``: each puller's storage-offset estimate (seconds; the true one is -skew) with
  its error bars, and ``bound``: the policy's limits and the widest lease pad used.
- ``backoff`` (``backoff=True``): a retry-policy subscription (minimum backoff 10 s); the
  puller behind nacks a message and the one ahead polls for it: how many true seconds the
  backoff lasted (10 asked).

Nothing here asserts: tests/integration/test_clock_skew.py does, on a small run; bench/chaos.py
runs it as its ``skew`` scenario.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "lib") not in sys.path:
    sys.path.insert(0, str(ROOT / "lib"))

ACK_DEADLINE = 10  # seconds, the subscription's (Pub/Sub's minimum)
BATCH = 100  # messages per pull


class SkewedClock:
    """A wall clock `skew` seconds off the true one. Remembers, per thread, the true time of
    its last reading, so the decision that follows can be placed in true time."""

    def __init__(self, skew: float) -> None:
        self.skew = skew
        self._last = threading.local()

    def __call__(self) -> float:
        t = time.time()
        self._last.true = t
        return t + self.skew

    def last_true(self) -> float:
        return float(getattr(self._last, "true", 0.0))


class _Recorder:
    """Wraps the delivery core's lease decision (``operations.select``) to note, per puller
    thread, the true time of the clock reading the decision used: the pull reads its clock
    last right before deciding (``delivery.operations.pull``), so that reading is this
    thread's last one. The last decision of a pull call is the one that committed (a
    conflict reruns the whole decision)."""

    def __init__(self) -> None:
        self.clocks: dict[int, SkewedClock] = {}
        self.decided = threading.local()

    @contextmanager
    def installed(self) -> Iterator[None]:
        from deltabus.delivery import operations

        original = operations.select

        def select(*args: Any, **kwargs: Any) -> Any:
            clock = self.clocks.get(threading.get_ident())
            if clock is not None:
                self.decided.true = clock.last_true()
            return original(*args, **kwargs)

        operations.select = select  # type: ignore[assignment]
        try:
            yield
        finally:
            operations.select = original  # type: ignore[assignment]


def _abandons(message_id: str, every: int) -> bool:
    return every > 0 and zlib.crc32(message_id.encode()) % every == 0


def run(
    scratch: Path,
    messages: int,
    skew_seconds: float,
    *,
    correct: bool = True,
    abandon_every: int = 10,
    backoff: bool = False,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Run the scenario in a new warehouse under `scratch`; return its figures (module docstring)."""
    from deltabus import PublisherClient, SubscriberClient, types

    policy = _policy() if correct else None
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    wh = tempfile.mkdtemp(prefix="skew-", dir=scratch)
    pub = PublisherClient(warehouse=wh)
    admin = SubscriberClient(warehouse=wh)
    topic = pub.topic_path("local", "skew")
    path = admin.subscription_path("local", "skew-pull")
    pub.create_topic(name=topic)
    admin.create_subscription(name=path, topic=topic, ack_deadline_seconds=ACK_DEADLINE)
    published: list[str] = []
    for start in range(0, messages, 10_000):
        n = min(10_000, messages - start)
        published += pub.publish_batch(topic, [types.PubsubMessage(data=b"m%d" % (start + i)) for i in range(n)])
    skews = {"ahead": skew_seconds, "behind": -skew_seconds, "exact": 0.0}
    clocks = {name: SkewedClock(s) for name, s in skews.items()}
    clients = {name: SubscriberClient(warehouse=wh, clock=clocks[name], **({"clock_skew": policy} if policy else {}))
               for name in skews}
    recorder = _Recorder()
    leases: list[tuple[str, int, str, float]] = []  # message id, attempt, puller, true decision time
    acks: list[tuple[str, int, str, float]] = []  # message id, attempt, puller, true time sent
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    budget = max_seconds if max_seconds is not None else 3 * ACK_DEADLINE + 2 * abs(skew_seconds) + messages / 200
    started = time.time()

    def puller(name: str) -> None:
        client, clock = clients[name], clocks[name]
        recorder.clocks[threading.get_ident()] = clock
        while not stop.is_set():
            try:
                recorder.decided.true = None
                got = client.pull(subscription=path, max_messages=BATCH, return_immediately=True).received_messages
                decided = recorder.decided.true
                if not got:
                    time.sleep(0.02)
                    continue
                assert decided is not None, "a pull leased without a recorded decision"
                ack_ids = []
                with lock:
                    for r in got:
                        mid, attempt = r.message.message_id, r.delivery_attempt
                        leases.append((mid, attempt, name, decided))
                        if attempt == 1 and _abandons(mid, abandon_every):
                            continue  # abandoned: the lease must run out
                        ack_ids.append(r.ack_id)
                        acks.append((mid, attempt, name, time.time()))
                if ack_ids:
                    client.acknowledge(subscription=path, ack_ids=ack_ids)
            except Exception as exc:  # recorded, and the puller goes on (a refused lease, a conflict)
                with lock:
                    errors.append(f"{name}: {type(exc).__name__}: {exc}")
                time.sleep(0.1)

    with recorder.installed():
        threads = [threading.Thread(target=puller, args=(n,), name=f"skew-{n}") for n in skews]
        for t in threads:
            t.start()
        try:
            while time.time() - started < budget:
                time.sleep(0.25)
                stats = admin.get_backlog(path)
                left = stats.num_undelivered_messages + stats.num_outstanding_messages + stats.expired_ack_deadlines
                if left == 0:
                    break
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        elapsed = time.time() - started
        stats = admin.get_backlog(path)
        held = stats.num_undelivered_messages + stats.num_outstanding_messages + stats.expired_ack_deadlines
        backoff_figures = _backoff(pub, admin, topic, clocks, policy) if backoff else None
    figures = check(published, leases, acks, ACK_DEADLINE)
    figures.update({
        "skew_seconds": skew_seconds,
        "correction": correct,
        "lost": max(figures["never_delivered"], held),
        "held_at_end": held,
        "seconds": round(elapsed, 2),
        "errors": len(errors),
        "error_samples": errors[:5],
        "offsets": {name: _estimate(clients[name]) for name in skews},
        "bound": _bound(policy, clients),
    })
    if backoff_figures is not None:
        figures["backoff"] = backoff_figures
    for c in [*clients.values(), admin]:
        c.close()
    pub.stop()
    return figures


def check(
    published: list[str],
    leases: list[tuple[str, int, str, float]],
    acks: list[tuple[str, int, str, float]],
    deadline: float,
) -> dict[str, Any]:
    """The invariants from the pullers' records (true times). Pure."""
    by_id: dict[str, list[tuple[str, int, str, float]]] = defaultdict(list)
    for lease in leases:
        by_id[lease[0]].append(lease)
    acked: dict[tuple[str, int], float] = {}
    for mid, attempt, _, t in acks:
        acked[(mid, attempt)] = min(t, acked.get((mid, attempt), t))
    twice: list[dict[str, Any]] = []
    redelivered: set[str] = set()
    stale = 0
    duplicates = 0
    for mid, rs in by_id.items():
        rs.sort(key=lambda r: (r[1], r[3]))
        for i, (_, attempt, who, at) in enumerate(rs):
            for _, a0, w0, t0 in rs[:i]:
                ends = min(t0 + deadline, acked.get((mid, a0), float("inf")))
                if at < ends:  # decided while the earlier lease still ran in true time
                    twice.append({"m": mid, "first": w0, "second": who, "early_by": round(t0 + deadline - at, 3)})
            if any((mid, a0) in acked for _, a0, _, _ in rs[:i]):
                redelivered.add(mid)
        # Each unacked delivery but the last explains one redelivery; the rest are duplicates.
        explained = sum(1 for _, a, _, _ in rs[:-1] if (mid, a) not in acked)
        duplicates += len(rs) - 1 - explained
        stale += sum(1 for _, a, _, _ in rs[:-1] if (mid, a) in acked)
    early = sorted(v["early_by"] for v in twice)
    pairs: dict[str, int] = defaultdict(int)
    for v in twice:
        pairs[f"{v['first']}->{v['second']}"] += 1
    return {
        "messages": len(published),
        "deliveries": len(leases),
        "duplicates": duplicates,
        "leases_granted_twice": len(twice),
        "granted_twice_early_by_max": early[-1] if early else 0.0,
        "granted_twice_by": dict(sorted(pairs.items())),
        "acked_redelivered": len(redelivered),
        "stale_acks": stale,
        "never_delivered": len(set(published) - set(by_id)),
        "violations": twice[:10],
    }


def _policy() -> Any:
    from deltabus.policy.clock_skew import ClockSkewPolicy

    return ClockSkewPolicy()


def _estimate(client: Any) -> dict[str, Any] | None:
    clock = getattr(client, "_clock", None)
    describe = getattr(clock, "describe", None)
    return describe() if callable(describe) else None


def _bound(policy: Any, clients: dict[str, Any]) -> dict[str, Any] | None:
    if policy is None:
        return None
    pads = [getattr(c._clock, "widest_pad", 0.0) for c in clients.values()]
    return {"max_uncertainty": policy.max_uncertainty, "granularity": policy.granularity, "drift": policy.drift,
            "widest_lease_pad": round(max(pads), 6)}


def _backoff(pub: Any, admin: Any, topic: str, clocks: dict[str, SkewedClock], policy: Any) -> dict[str, Any]:
    """The puller behind nacks one message of a subscription with a 10 s minimum backoff; the
    one ahead polls for it. Returns how long (true seconds) the message stayed away."""
    from deltabus import SubscriberClient, types

    path = admin.subscription_path("local", "skew-backoff")
    admin.create_subscription(request={"name": path, "topic": topic, "ack_deadline_seconds": ACK_DEADLINE,
                                       "retry_policy": types.RetryPolicy(minimum_backoff=10, maximum_backoff=600)})
    extra = {"clock_skew": policy} if policy else {}
    behind = SubscriberClient(warehouse=admin.engine.warehouse, clock=clocks["behind"], **extra)
    ahead = SubscriberClient(warehouse=admin.engine.warehouse, clock=clocks["ahead"], **extra)
    pub.publish_batch(topic, [types.PubsubMessage(data=b"backoff")])
    got: list[Any] = []
    while not got:
        got = behind.pull(subscription=path, max_messages=1, return_immediately=True).received_messages
    behind.modify_ack_deadline(subscription=path, ack_ids=[got[0].ack_id], ack_deadline_seconds=0)
    nacked = time.time()
    again: list[Any] = []
    while not again and time.time() - nacked < 30:
        again = ahead.pull(subscription=path, max_messages=1, return_immediately=True).received_messages
        if not again:
            time.sleep(0.05)
    waited = time.time() - nacked
    if again:
        ahead.acknowledge(subscription=path, ack_ids=[again[0].ack_id])
    behind.close()
    ahead.close()
    return {"asked_seconds": 10, "true_seconds": round(waited, 2), "redelivered": bool(again)}


@contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="deltabus-skew-") as d:
        yield Path(d)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2_000)
    ap.add_argument("--skew", type=float, default=30.0)
    ap.add_argument("--no-correction", action="store_true", help="inject the skew only (the behaviour before the bound)")
    ap.add_argument("--backoff", action="store_true", help="also measure a retry backoff across the two clocks")
    args = ap.parse_args(argv)
    with _scratch() as d:
        out = run(d, args.messages, args.skew, correct=not args.no_correction, backoff=args.backoff)
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
