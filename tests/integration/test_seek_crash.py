"""Snapshots and seek killed with SIGKILL (issue 15): no registry row is ever left without
its messages, a crash's leftover messages are swept by maintenance, and a seek is all or
nothing: the unacked set afterwards is exactly the one before or the one it makes, never
a mix, and nothing is delivered twice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import deltabus
from deltabus import SubscriberClient, retention
from deltabus.delivery.cursor import cursor_app_id
from deltabus.errors import NotFound
from deltabus.storage import open_engine
from tests.conftest import ManualClock
from tests.integration import _seek_worker as worker

WORKER = Path(worker.__file__)
P = "local"


def start(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def killed(*args: str) -> None:
    proc = start(*args)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, f"exit {proc.returncode}\n{err[-3000:]}"


def snapshot_rows(warehouse: str) -> int:
    return open_engine(warehouse, engine="delta-rs", create=False).snapshot("snapshot_messages").read(columns=["message_id"]).num_rows


@pytest.fixture
def held(pub, sub, topic) -> str:
    name = sub.subscription_path(P, "crash-snap")
    sub.create_subscription(name=name, topic=topic)
    pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(3)])
    assert len(sub.pull(subscription=name, max_messages=10, return_immediately=True).received_messages) == 3
    return name


def test_a_create_killed_before_its_registry_row_leaves_no_snapshot_and_its_messages_are_swept(sub, held, warehouse) -> None:
    snap = sub.snapshot_path(P, "half-made")
    killed("create", "after-messages", warehouse, held, snap)
    with pytest.raises(NotFound):
        sub.get_snapshot(snapshot=snap)
    assert snapshot_rows(warehouse) == 3  # the orphan: nobody reads it
    sub.create_snapshot(name=snap, subscription=held)  # the name is free: made again, whole
    assert snapshot_rows(warehouse) == 6
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    assert retention.apply_retention(engine, clock=time.time)["snapshot_orphans"] == 0  # too young to tell from a create
    report = retention.apply_retention(engine, clock=ManualClock(time.time() + 2 * 3600))
    assert report["snapshot_orphans"] == 1 and snapshot_rows(warehouse) == 3
    sub.seek(subscription=held, snapshot=snap)
    assert len(sub.pull(subscription=held, max_messages=10, return_immediately=True).received_messages) == 3


def test_a_delete_killed_after_its_registry_row_leaves_the_snapshot_gone(sub, held, warehouse) -> None:
    snap = sub.snapshot_path(P, "half-gone")
    sub.create_snapshot(name=snap, subscription=held)
    killed("delete", "after-row", warehouse, held, snap)
    with pytest.raises(NotFound):
        sub.get_snapshot(snapshot=snap)
    with pytest.raises(NotFound):
        sub.seek(subscription=held, snapshot=snap)
    assert snapshot_rows(warehouse) == 3
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    assert retention.apply_retention(engine, clock=ManualClock(time.time() + 2 * 3600))["snapshot_orphans"] == 1
    assert snapshot_rows(warehouse) == 0


N = 10_000


def partition_state(warehouse: str, sub_uid: str) -> tuple[int, int, int | None]:
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    snap = engine.snapshot("deliveries")
    ids = snap.read(columns=["message_id"], partition=sub_uid)["message_id"].to_pylist()
    return len(ids), len(set(ids)), snap.txn_version(cursor_app_id(sub_uid))


def test_a_seek_killed_at_any_moment_is_all_or_nothing(pub, warehouse, tmp_path) -> None:
    """A seek to the epoch on a subscription that has acked nothing yet and retains acked
    messages: before, no row and no cursor; after, N rows and the cursor at the end. Runs
    killed at several moments of the seek leave one or the other, and the next seek (or
    pull) finishes it, each message once."""
    topic = pub.topic_path(P, "big-replay")
    pub.create_topic(name=topic)
    with SubscriberClient(warehouse=warehouse) as client:
        name = client.subscription_path(P, "big-replay")
        client.create_subscription(request={"name": name, "topic": topic, "retain_acked_messages": True})
        uid = client._sub(name).sub_uid
    for start_at in range(0, N, 5_000):
        pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(start_at, start_at + 5_000)])
    latest = open_engine(warehouse, engine="delta-rs", create=False).version("messages")
    assert partition_state(warehouse, uid) == (0, 0, None)
    outcomes = []
    for delay in (0.0, 0.4, 1.5):
        copy = str(tmp_path / f"kill-{delay}")
        shutil.copytree(warehouse, copy)
        proc = start("seek-time", "ready", copy, name, "-")
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        rows, distinct, cursor = partition_state(copy, uid)
        assert rows == distinct, delay  # never two rows of one message
        assert (rows, cursor) in ((0, None), (N, latest)), (delay, rows, cursor)
        outcomes.append(rows == N)
        with SubscriberClient(warehouse=copy) as client:
            client.seek(subscription=name, time=0)
            assert partition_state(copy, uid) == (N, N, latest), delay
            got: list[str] = []
            while batch := client.pull(subscription=name, max_messages=5_000, return_immediately=True).received_messages:
                got += [m.message.message_id for m in batch]
                client.acknowledge(subscription=name, ack_ids=[m.ack_id for m in batch])
            assert len(got) == len(set(got)) == N, delay
    assert not all(outcomes), "no kill landed before the seek committed: the test did not test a crash"
