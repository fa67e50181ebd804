"""The idle hint names the watched tables' versions as the batch saw them (policy.idle_wake):
a commit landing while an idle batch runs (here a subscription created between the batch's
reads and its hint) must wake the next trigger, not wait out the hint's recheck. The job's
own ``process`` on delta-rs, no Spark."""

from __future__ import annotations

import time

from deltabus import config
from deltabus.policy.idle_wake import WATCHED, may_skip
from deltabus.push.job import DeliveryJob
from deltabus.spark import idle_hint
from deltabus.storage import open_engine


def test_a_commit_during_an_idle_batch_is_not_folded_into_its_hint(sub, topic, warehouse, tmp_path):
    settings = config.Settings(warehouse=warehouse, engine="delta-rs", backlog_interval=0.0,
                               checkpoint_dir=str(tmp_path / "checkpoints"))
    job = DeliveryJob(None, settings)  # type: ignore[arg-type]  # no pushes: no Spark
    try:
        assert job.idle_hint is not None
        refresh = job.backlog.refresh

        def refresh_after_a_change(*args, **kwargs):  # type: ignore[no-untyped-def]
            # After the batch read the registry: a subscription appears (as a pull one made
            # push, or a new push subscription with a backlog, would).
            sub.create_subscription(name=sub.subscription_path("local", "created-mid-batch"), topic=topic)
            return refresh(*args, **kwargs)

        job.backlog.refresh = refresh_after_a_change  # type: ignore[method-assign]
        job.process(None, 1)
        assert job.idle
        hint = idle_hint.read(job.idle_hint)
        assert hint is not None
        engine = open_engine(warehouse, engine="delta-rs")
        now = {t: engine.version(t) for t in WATCHED}
        assert not may_skip(hint, now, time.time())  # the next trigger runs a batch
    finally:
        job.close()
