"""Dead-lettering killed with SIGKILL between its commits (issue 13), through the real pull
and the real push job's batch, then finished by a fresh process: the message ends up on the
dead-letter topic exactly once and off its subscription, never lost.

Which way a crash fails (delivery/dead_letter.py): after the mark (commit 1) or the copy
(commit 2) the message is held on the subscription (marked: never leased again) until the
next decision's ``recover`` finishes the move; the copy is keyed, so a rerun never appends
it twice. A kill before commit 1 leaves nothing, and the next decision makes the move.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

import deltabus
from deltabus import SubscriberClient, config
from deltabus.delivery import dead_letter
from deltabus.push.job import DeliveryJob
from deltabus.storage import open_engine
from deltabus.types import DeadLetterPolicy
from tests.endpoints import Behaviour, Endpoint
from tests.integration import _dead_letter_worker as worker

# Its tests run in a pytest process of their own beside the session's others (tests/background.py):
# about 20 s: a push job in its SparkSession, killed.
OUT_OF_PROCESS = True

WORKER = Path(worker.__file__)
# What a process killed at each point leaves: (marked rows on the subscription, copies on
# the dead-letter topic, rows left on the subscription).
DIED_WITH = {"after-mark": (1, 0, 1), "after-copy": (1, 1, 1), "after-drop": (0, 1, 0)}


def start(mode: str, kill_at: str, *targets: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(WORKER), mode, kill_at, *targets], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def state(warehouse: str, sub: str, dl_topic: str) -> tuple[int, int, int]:
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    with SubscriberClient(warehouse=warehouse) as client:
        rec = client._sub(sub)
        topic_uid = client._registry.topic(dl_topic).topic_uid
    rows = engine.snapshot("deliveries").read(columns=["message_id", dead_letter.MARK_COLUMN], partition=rec.sub_uid)
    copies = engine.snapshot("messages").read(columns=["message_id"], partition=topic_uid)
    return int(pc.sum(pc.is_valid(rows[dead_letter.MARK_COLUMN])).as_py() or 0), copies.num_rows, rows.num_rows


def kill_and_recover(mode: str, prepared: str, sub: str, dl_topic: str, dl_sub: str, tmp: Path) -> None:
    """Copy the prepared warehouse once per kill point, kill a run in each (all at once), then
    run one fresh process over all of them and check every one ends the same way."""
    warehouses = {}
    for point in worker.KILL_POINTS:
        warehouses[point] = str(tmp / point)
        shutil.copytree(prepared, warehouses[point])
    killed = {p: start(mode, p, f"{w}:{sub}") for p, w in warehouses.items()}
    for point, proc in killed.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, f"{point}: exit {proc.returncode}\n{err[-3000:]}"
        assert state(warehouses[point], sub, dl_topic) == DIED_WITH[point], point
    recovery = start(mode, "none", *(f"{w}:{sub}" for w in warehouses.values()))
    out, err = recovery.communicate(timeout=120)
    assert recovery.returncode == 0, err[-3000:]
    for (point, warehouse), line in zip(warehouses.items(), out.splitlines()):
        assert json.loads(line).get("received", []) == [], point  # never delivered again after the mark
        assert state(warehouse, sub, dl_topic) == (0, 1, 0), point
        with SubscriberClient(warehouse=warehouse) as client:
            (copy,) = client.pull(subscription=dl_sub, max_messages=10, return_immediately=True).received_messages
            assert copy.message.data == b"poison", point
            assert copy.message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5", point


def topics(pub, client, name: str) -> tuple[str, str, str]:
    topic = pub.topic_path("local", f"{name}-src")
    dl_topic = pub.topic_path("local", f"{name}-dlq")
    pub.create_topic(name=topic)
    pub.create_topic(name=dl_topic)
    dl_sub = client.subscription_path("local", f"{name}-dlq-pull")
    client.create_subscription(name=dl_sub, topic=dl_topic)
    return topic, dl_topic, dl_sub


def test_a_pull_killed_mid_dead_lettering_is_finished_by_the_next_pull(pub, warehouse, tmp_path):
    with SubscriberClient(warehouse=warehouse) as client:
        topic, dl_topic, dl_sub = topics(pub, client, "crash-pull")
        s = client.subscription_path("local", "crash-pull")
        client.create_subscription(request={"name": s, "topic": topic, "dead_letter_policy": DeadLetterPolicy(dl_topic, 5)})
        pub.publish_batch(topic, [{"data": b"poison"}])
        for _ in range(5):
            (got,) = client.pull(subscription=s, max_messages=10, return_immediately=True).received_messages
            client.modify_ack_deadline(subscription=s, ack_ids=[got.ack_id], ack_deadline_seconds=0)
    kill_and_recover("pull", warehouse, s, dl_topic, dl_sub, tmp_path / "runs")


class _Decided(Exception):
    """Raised where the job would mark its first given-up row: the state to crash from."""


@pytest.mark.spark
def test_the_push_job_killed_mid_dead_lettering_loses_nothing(spark, pub, psub, warehouse, tmp_path, monkeypatch):
    topic, dl_topic, dl_sub = topics(pub, psub, "crash-push")
    with Endpoint(Behaviour(lambda r, n: (500, 0.0))) as endpoint:
        s = psub.subscription_path("local", "crash-push")
        psub.create_subscription(request={"name": s, "topic": topic, "push_config": {"push_endpoint": endpoint.url},
                                          "dead_letter_policy": DeadLetterPolicy(dl_topic, 5), "ack_deadline_seconds": 60})
        pub.publish_batch(topic, [{"data": b"poison"}])

        def stop(*_: object) -> None:
            raise _Decided

        monkeypatch.setattr(dead_letter.DeadLetterMover, "mark", stop)
        settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.05, backlog_interval=3600.0,
                                   engine="delta-rs")
        job = DeliveryJob(spark, settings)
        try:
            with pytest.raises(_Decided):
                for batch in range(1, 600):
                    job.process(None, batch)
                    time.sleep(0.05)
        finally:
            job.close()
        monkeypatch.undo()
        assert len(endpoint.snapshot()) == 5
    kill_and_recover("push", warehouse, s, dl_topic, dl_sub, tmp_path / "runs")
