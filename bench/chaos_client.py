"""One client process of the chaos suite's concurrent scenario (bench/chaos.py); it may be
SIGKILLed at any moment, and records what it did as JSON lines, each written and flushed
before the next call (a kill loses at most the line of the call in flight).

Roles: ``publisher`` (the library's publish_batch), ``puller`` (the library's pull +
acknowledge: each receipt with its pull call's start, each ack once confirmed),
``subscriber`` (the library's subscribe()), ``grpc-subscriber`` / ``grpc-publisher``
(google-cloud-pubsub through ``deltabus serve`` at --host), ``drain`` (a puller that stops
once the subscription gave nothing for two ack deadlines and has no unacked message left). SIGTERM stops a role cleanly.

Records: {"e": "start", "pid", "role"} first in each run (a restarted client appends to its
file); {"e": "pub", "ids": [...]} once a publish returned; {"e": "recv", "ids", "t",
"called", "deadline"} (``called`` None for subscribe(), whose lease round is not seen);
{"e": "ack-call", "ids"} before an acknowledge call and {"e": "ack", "ids", "t"} once it
returned; {"e": "sub-ack", "ids"} after
a subscribe() callback acked; {"e": "error", "what"} for anything unexpected.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

STOP = threading.Event()


class Records:
    def __init__(self, path: Path) -> None:
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def newline(self) -> None:
        with self._lock:
            self._f.write("\n")
            self._f.flush()

    def write(self, **e: Any) -> None:
        with self._lock:
            self._f.write(json.dumps(e, separators=(",", ":")) + "\n")
            self._f.flush()


def publisher(a: argparse.Namespace, out: Records, rng: random.Random) -> None:
    from deltabus import PublisherClient

    pub = PublisherClient(warehouse=a.warehouse)
    n = 0
    while not STOP.is_set():
        k = rng.randint(1, 200)
        ids = pub.publish_batch(a.topic, [{"data": os.urandom(32), "attributes": {"p": str(os.getpid()), "n": str(n + i)}}
                                          for i in range(k)])
        n += k
        out.write(e="pub", ids=list(ids))
        time.sleep(rng.uniform(0.0, 0.2))


def puller(a: argparse.Namespace, out: Records, rng: random.Random, *, drain: bool = False) -> None:
    from deltabus import SubscriberClient

    sub = SubscriberClient(warehouse=a.warehouse)
    empty_since = time.time()
    while not STOP.is_set():
        called = time.time()
        resp = sub.pull(subscription=a.subscription, max_messages=rng.randint(1, 300))
        got = resp.received_messages
        now = time.time()
        if got:
            empty_since = now
            out.write(e="recv", ids=[m.message.message_id for m in got], t=now, called=called, deadline=a.deadline)
            if not drain:
                time.sleep(rng.uniform(0.0, 0.3))  # some work
            out.write(e="ack-call", ids=[m.message.message_id for m in got])  # a kill mid-call may leave it applied
            sub.acknowledge(subscription=a.subscription, ack_ids=[m.ack_id for m in got])
            out.write(e="ack", ids=[m.message.message_id for m in got], t=time.time())
        elif drain and now - empty_since > 2 * a.deadline and sub.get_backlog(a.subscription).num_unacked_messages == 0:
            return  # (a killed client's leases, up to its lease extensions, run out before this)
        else:
            time.sleep(0.1)


def subscriber(a: argparse.Namespace, out: Records, rng: random.Random, *, grpc_client: bool) -> None:
    cap = {} if a.lease_cap is None else {"max_duration_per_lease_extension": a.lease_cap}
    if grpc_client:
        os.environ["PUBSUB_EMULATOR_HOST"] = a.host
        from google.cloud import pubsub_v1

        client: Any = pubsub_v1.SubscriberClient()
        flow = pubsub_v1.types.FlowControl(max_messages=rng.randint(10, 500), **cap)
    else:
        from deltabus import SubscriberClient
        from deltabus.types import FlowControl

        client = SubscriberClient(warehouse=a.warehouse)
        flow = FlowControl(max_messages=rng.randint(10, 500), **cap)

    def callback(message: Any) -> None:
        out.write(e="recv", ids=[message.message_id], t=time.time(), called=None, deadline=a.deadline)
        message.ack()
        out.write(e="sub-ack", ids=[message.message_id])

    future = client.subscribe(a.subscription, callback, flow_control=flow)
    STOP.wait()
    future.cancel()
    try:
        future.result(timeout=30)
    except Exception:
        pass


def grpc_publisher(a: argparse.Namespace, out: Records, rng: random.Random) -> None:
    os.environ["PUBSUB_EMULATOR_HOST"] = a.host
    from google.cloud import pubsub_v1

    pub = pubsub_v1.PublisherClient()
    n = 0
    while not STOP.is_set():
        k = rng.randint(1, 100)
        futures = [pub.publish(a.topic, os.urandom(32), n=str(n + i)) for i in range(k)]
        n += k
        out.write(e="pub", ids=[f.result(timeout=60) for f in futures])
        time.sleep(rng.uniform(0.0, 0.2))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["publisher", "puller", "subscriber", "grpc-subscriber", "grpc-publisher", "drain"])
    p.add_argument("--warehouse", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--subscription", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, required=True)
    p.add_argument("--host")
    p.add_argument("--lease-cap", type=int, help="subscribe()'s FlowControl.max_duration_per_lease_extension")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    out = Records(a.out)
    out.newline()  # ends a line the previous run's kill may have cut, so this record stands alone
    out.write(e="start", pid=os.getpid(), role=a.role)
    rng = random.Random(a.seed)
    try:
        if a.role == "publisher":
            publisher(a, out, rng)
        elif a.role == "grpc-publisher":
            grpc_publisher(a, out, rng)
        elif a.role in ("puller", "drain"):
            puller(a, out, rng, drain=a.role == "drain")
        else:
            subscriber(a, out, rng, grpc_client=a.role == "grpc-subscriber")
    except Exception as exc:
        out.write(e="error", what=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
