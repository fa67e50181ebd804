"""An idle push job makes no micro-batches until a table it watches moves (policy.idle_wake,
spark.idle_hint): real Delta tables, a real aiohttp endpoint, local Spark."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable

import pytest

from deltabus import config
from deltabus.policy.idle_wake import WATCHED, IdleHint
from deltabus.push import runner
from deltabus.spark import idle_hint
from deltabus.push.micro_batch import checkpoint_for
from deltabus.storage import open_engine
from tests.endpoints import Endpoint

pytestmark = pytest.mark.spark


def _settings(warehouse: str) -> config.Settings:
    return config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.1, backlog_interval=0.2, engine="delta-rs")


def _wait(what: str, ok: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not ok():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _batches(checkpoint: str) -> int:
    """Micro-batches the query committed (Spark's commit log holds one file per batch)."""
    commits = os.path.join(checkpoint, "commits")
    return len([f for f in os.listdir(commits) if f.isdigit()]) if os.path.isdir(commits) else 0


def test_an_idle_job_skips_triggers_until_a_publish_or_a_subscription_change(spark, pub, psub, topic, warehouse):
    settings = _settings(warehouse)
    checkpoint = checkpoint_for(settings.checkpoint_path, "delta-rs")
    hint = idle_hint.hint_path(checkpoint)
    assert hint is not None
    with Endpoint() as ep:
        push = psub.subscription_path("local", "idle-push")
        psub.create_subscription(name=push, topic=topic, push_config={"push_endpoint": ep.url})
        stop = threading.Event()
        job = threading.Thread(target=runner.run, args=(spark, settings), kwargs=dict(stop=stop, max_seconds=240), daemon=True)
        job.start()
        try:
            _wait("the idle hint", lambda: idle_hint.read(hint) is not None)
            before = _batches(checkpoint)
            time.sleep(2.0)  # 20 triggers of 0.1 s
            assert _batches(checkpoint) - before <= 1  # (one may have been planned as the hint was written)

            # A publish (the messages table moves) wakes it.
            ids = pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])
            _wait("the pushes", lambda: {json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()} >= set(ids))

            # A pull subscription's backlog, then the subscription made push (only the
            # subscriptions table moves): the job wakes and pushes it.
            later = psub.subscription_path("local", "idle-later")
            psub.create_subscription(name=later, topic=topic)
            kept = pub.publish_batch(topic, [{"data": b"c"}])
            _wait("the job idle again", lambda: (h := idle_hint.read(hint)) is not None
                  and h.versions["messages"] == open_engine(warehouse, engine="delta-rs").version("messages"))
            with Endpoint() as ep2:
                psub.modify_push_config(subscription=later, push_config={"push_endpoint": ep2.url})
                _wait("the new push subscription's backlog", lambda: [json.loads(r.body)["message"]["messageId"]
                                                                      for r in ep2.snapshot()] == kept)
            _wait("everything acked", lambda: psub.get_backlog(later).num_unacked_messages == 0
                  and psub.get_backlog(push).num_unacked_messages == 0)
        finally:
            stop.set()
            job.join(120)
    assert not job.is_alive()


def test_a_hint_left_by_an_earlier_run_does_not_hold_back_the_next(spark, pub, psub, topic, warehouse):
    """What a run killed while idle leaves: a hint naming the tables' versions. Here it names
    them as they are after the run (a subscription made push since, with a backlog: no new
    messages, so the resumed query has no new offset of its own) and says to recheck only
    after an hour: the next run must clear it, not obey it."""
    settings = _settings(warehouse)
    later = psub.subscription_path("local", "idle-stale")
    psub.create_subscription(name=later, topic=topic)
    ids = pub.publish_batch(topic, [{"data": b"x"}, {"data": b"y"}])
    first = runner.run(spark, settings, until_idle=True, max_seconds=120)  # no push subscription: idle at once
    assert first.delivered == 0
    with Endpoint() as ep:
        psub.modify_push_config(subscription=later, push_config={"push_endpoint": ep.url})
        engine = open_engine(warehouse, engine="delta-rs")
        hint = idle_hint.hint_path(checkpoint_for(settings.checkpoint_path, "delta-rs"))
        assert hint is not None
        idle_hint.write(hint, IdleHint({t: engine.version(t) for t in WATCHED}, time.time(), 3600.0))
        summary = runner.run(spark, settings, until_idle=True, max_seconds=60)
        assert sorted(json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()) == sorted(ids)
        assert summary.acked == 2
