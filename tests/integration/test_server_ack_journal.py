"""`deltabus serve`'s ack journal (server/ack_journal.py) with a real server process and the
REAL google-cloud-pubsub client: acks answered from the journal before their commit survive
a SIGKILL (the next start applies them: no acked message comes back), a clean stop commits
them, and exactly-once acks never take that path."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from google.cloud import pubsub_v1

from deltabus.registry import Registry
from deltabus.server.app import ServerThread, journal_dir
from deltabus.server.settings import ServeSettings
from deltabus.storage import open_engine
from tests.conftest import delivery_state
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

# Its tests run in a pytest process of their own beside the session's others (tests/background.py):
# real server processes and the google client, with PUBSUB_EMULATOR_HOST set.
OUT_OF_PROCESS = True

T = f"projects/{PROJECT}/topics/journal-topic"
S = f"projects/{PROJECT}/subscriptions/journal-sub"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(warehouse: str, port: int, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltabus.cli", "serve", "--warehouse", warehouse, "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert re.search(r" on 127\.0\.0\.1:\d+,", line), line
    return proc


def _journaled(warehouse: str) -> list[str]:
    """Every ack id in the warehouse's journals, in order."""
    d = Path(journal_dir(os.path.abspath(warehouse)))
    if not d.is_dir():
        return []
    out: list[str] = []
    for f in sorted(d.glob("*.acks")):
        for line in f.read_bytes().splitlines():
            out.extend(json.loads(line)["ack_ids"])
    return out


def _rows(warehouse: str, subscription: str = S) -> int:
    """The subscription's deliveries rows (acked messages have none)."""
    engine = open_engine(warehouse, engine="delta-rs")
    uid = Registry(engine, clock=time.time).subscription(subscription).sub_uid
    rows = delivery_state(engine.snapshot("deliveries").read(["sub_uid", "message_id"]))
    return sum(1 for u in rows["sub_uid"].to_pylist() if u == uid)


class Acker:
    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, m: Any) -> None:
        self.seen[m.message_id] = self.seen.get(m.message_id, 0) + 1
        m.ack()


def _until(check: Any, seconds: float = 60.0) -> None:
    give_up = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.05)


@contextlib.contextmanager
def _served(warehouse: str, monkeypatch: pytest.MonkeyPatch, defer_seconds: float, ack_deadline: int = 60) -> Iterator[tuple[ServerThread, Any, Any]]:
    """A server in this process (``--defer-seconds`` as given), the real clients pointed at
    it, topic T and subscription S, and 20 messages published."""
    server = ServerThread(ServeSettings(warehouse=warehouse, port=0, grace_seconds=1.0, defer_seconds=defer_seconds)).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{server.port}")
    pubc, subc = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    try:
        assert server.state.acks is not None
        pubc.create_topic(name=T)
        subc.create_subscription(name=S, topic=T, ack_deadline_seconds=ack_deadline)
        for f in [pubc.publish(T, b"x") for _ in range(20)]:
            f.result(timeout=30)
        yield server, pubc, subc
    finally:
        subc.close()
        pubc.stop()
        server.stop()


def _ack_all_journaled(warehouse: str, subc: Any) -> None:
    """subscribe() with 60 s leases, acking each message, until the journal holds all 20 acks."""
    future = subc.subscribe(S, Acker(), flow_control=pubsub_v1.types.FlowControl(min_duration_per_lease_extension=60))
    try:
        _until(lambda: len(_journaled(warehouse)) >= 20)
    finally:
        future.cancel()


def _ack_with_responses(subc: Any, subscription: str, n: int, flow: Any = None) -> None:
    """subscribe(), each message acked with ``ack_with_response()``, until `n` answers came."""
    responses: list[Any] = []
    kwargs = {} if flow is None else {"flow_control": flow}
    future = subc.subscribe(subscription, lambda m: responses.append(m.ack_with_response()), **kwargs)
    try:
        _until(lambda: len(responses) >= n)
        for r in responses:
            r.result(timeout=30)
    finally:
        future.cancel()


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_acks_answered_from_the_journal_are_applied_after_a_sigkill_and_committed_by_a_clean_stop(
    warehouse: str, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    port = _free_port()
    # 20 s: nothing the client acks commits on its own while the test looks (its leases, 60 s,
    # outlast that and ACK_LEASE_MARGIN, so its acks are journaled)
    proc = _start(warehouse, port, "--defer-seconds", "20")
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{port}")
    pubc, subc = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    future = None
    try:
        pubc.create_topic(name=T)
        subc.create_subscription(name=S, topic=T, ack_deadline_seconds=60)
        ids = [f.result(timeout=30) for f in [pubc.publish(T, f"m{i}".encode()) for i in range(200)]]
        got = Acker()
        future = subc.subscribe(S, got, flow_control=pubsub_v1.types.FlowControl(min_duration_per_lease_extension=60))
        _until(lambda: len(_journaled(warehouse)) >= 200)  # the server answered every ack...
        assert sorted(got.seen) == sorted(ids)
        assert _rows(warehouse) == 200  # ...and committed none of them yet
        if stop == "SIGKILL":
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert len(_journaled(warehouse)) >= 200  # the journal outlives its server
            assert _rows(warehouse) == 200
            proc = _start(warehouse, port)  # applies the journal before it serves
        else:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        assert _rows(warehouse) == 0  # every acked message is acked on the table: none can come back
        assert _journaled(warehouse) == []
        assert set(got.seen.values()) == {1}, {k: v for k, v in got.seen.items() if v > 1}
    finally:
        if future is not None:
            future.cancel()
        subc.close()
        pubc.stop()
        _kill(proc)


def test_exactly_once_acks_are_committed_before_they_are_answered_never_journaled(serve_thread, gpub, gsub, warehouse) -> None:
    journal = serve_thread.state.acks
    assert journal is not None
    for name, eod in (("eod", True), ("plain", False)):  # (exactly-once first: the plain acks arrive late)
        topic, sub = f"projects/{PROJECT}/topics/{name}", f"projects/{PROJECT}/subscriptions/{name}"
        gpub.create_topic(name=topic)
        gsub.create_subscription(request={"name": sub, "topic": topic, "enable_exactly_once_delivery": eod})
        for f in [gpub.publish(topic, b"x") for _ in range(20)]:
            f.result(timeout=30)
        before = journal.lines
        _ack_with_responses(gsub, sub, 20)
        if eod:
            _until(lambda: _rows(warehouse, sub) == 0)
            assert journal.lines == before  # each ack's result came from its commit
        else:
            _until(lambda: journal.lines > before)  # (the client sends its acks a moment after the callback)


def test_an_ack_whose_lease_could_end_before_its_deferred_commit_commits_before_it_is_answered(
    warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases of 10 s and a deferral of 6 s: 6 + ACK_LEASE_MARGIN (5) is past the lease, so no
    ack is journaled (a lease that ran out while its ack waited would let the message go
    again), and every ack is on the table when its call returns."""
    with _served(warehouse, monkeypatch, 6.0, ack_deadline=10) as (server, pubc, subc):
        journal = server.state.acks
        assert journal is not None
        _ack_with_responses(subc, S, 20, pubsub_v1.types.FlowControl(max_duration_per_lease_extension=10))  # leases: 10 s
        _until(lambda: _rows(warehouse) == 0)  # every ack on the table (the client sends them a moment after the callbacks)
        assert journal.lines == 0  # none of them was journaled


def test_a_start_applies_a_dead_server_s_journal_and_treats_acks_of_a_detached_or_deleted_subscription_as_moot(
    pub, sub, topic, subscription, warehouse
) -> None:
    """open_journal (what a start runs before it serves), on real tables: the acks of a live
    subscription apply; those of a detached one and of one deleted since are moot (the start
    must not fail on them); an ack id that does not parse is skipped; the file goes."""
    from deltabus import ackid
    from deltabus.server.app import open_journal

    gone = sub.subscription_path("local", "gone")
    cut = sub.subscription_path("local", "cut")
    for name in (gone, cut):
        sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=600)
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])
    leased = {name: sub.pull(subscription=name, max_messages=10).received_messages for name in (subscription, gone, cut)}
    assert all(len(v) == 2 for v in leased.values())
    d = Path(journal_dir(os.path.abspath(warehouse)))
    d.mkdir(parents=True)
    lines = [{"subscription": name, "ack_ids": [m.ack_id for m in leased[name]] + (["not-an-ack-id"] if name == subscription else [])}
             for name in (subscription, gone, cut)]
    (d / "dead.acks").write_text("".join(json.dumps(x) + "\n" for x in lines))
    pub.detach_subscription(request={"subscription": cut})
    sub.delete_subscription(subscription=gone)

    engine = open_engine(warehouse, engine="delta-rs")
    journal = open_journal(engine, Registry(engine, clock=time.time), time.time)
    try:
        assert journal is not None and not (d / "dead.acks").exists()
        assert _rows(warehouse, subscription) == 0  # both acks applied
        assert ackid.decode(leased[subscription][0].ack_id)  # (real ack ids)
    finally:
        journal.close()


def test_journaled_acks_of_a_subscription_detached_before_their_commit_are_moot_not_retried_forever(
    warehouse: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _served(warehouse, monkeypatch, 2.0) as (server, pubc, subc):
        journal = server.state.acks
        assert journal is not None
        _ack_all_journaled(warehouse, subc)
        pubc.detach_subscription(request={"subscription": S})  # before the deferred acks' round (2 s)
        _until(lambda: all(os.path.getsize(p) == 0 for p in journal.paths), 30)  # their round failed as moot: nothing outstanding


def test_create_snapshot_commits_the_subscription_s_journaled_acks_first(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot taken while acks wait in the journal must hold them as acked: else a seek to
    it would deliver acked messages again."""
    with _served(warehouse, monkeypatch, 30.0) as (server, pubc, subc):
        _ack_all_journaled(warehouse, subc)
        assert _rows(warehouse) == 20  # answered, not committed (30 s deferral)
        snap = f"projects/{PROJECT}/snapshots/journal-snap"
        subc.create_snapshot(name=snap, subscription=S)
        assert _rows(warehouse) == 0
        subc.seek(request={"subscription": S, "snapshot": snap})
        assert subc.pull(subscription=S, max_messages=10, return_immediately=True).received_messages == []
