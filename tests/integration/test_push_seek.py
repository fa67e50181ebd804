"""The push job honours seek while it runs (issue 15): seeks back in time and to a snapshot,
made between deliveries, replay exactly the expected messages to a real endpoint, and a
seek forward skips what came before it."""

from __future__ import annotations

import collections
import json
import threading
import time

import pytest

from deltabus.push import runner
from tests.endpoints import Endpoint
from tests.integration.test_push import settings

pytestmark = pytest.mark.spark


def pushed(endpoint: Endpoint) -> collections.Counter[str]:
    return collections.Counter(json.loads(r.body)["message"]["messageId"] for r in endpoint.snapshot())


def settled(psub, name: str, endpoint: Endpoint, total: int, deadline: float) -> None:
    """Wait until the endpoint got `total` pushes and the subscription has nothing unacked."""
    while time.time() < deadline:
        if len(endpoint.snapshot()) >= total and psub.get_backlog(name).num_unacked_messages == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"{len(endpoint.snapshot())} pushes of {total} expected; backlog {psub.get_backlog(name)}")


def test_seek_back_and_forth_while_the_push_job_runs(spark, pub, psub, topic, warehouse) -> None:
    with Endpoint() as ep:
        name = psub.subscription_path("local", "pushed-seek")
        psub.create_subscription(request={"name": name, "topic": topic, "push_config": {"push_endpoint": ep.url},
                                          "retain_acked_messages": True})
        stop = threading.Event()
        # No backlog refreshes (settled() computes the backlog itself): the batches stay short.
        job = threading.Thread(target=runner.run, args=(spark, settings(warehouse, trigger_interval=0.1, backlog_interval=3600.0)),
                               kwargs={"stop": stop, "max_seconds": 240})
        job.start()
        try:
            deadline = time.time() + 180
            first = pub.publish_batch(topic, [{"data": f"a{i}".encode()} for i in range(20)])
            settled(psub, name, ep, 20, deadline)
            psub.seek(subscription=name, time=0)  # back: the 20 again
            settled(psub, name, ep, 40, deadline)
            snap = psub.snapshot_path("local", "after-first")
            psub.create_snapshot(name=snap, subscription=name)  # nothing unacked; what comes after is in it
            second = pub.publish_batch(topic, [{"data": f"b{i}".encode()} for i in range(10)])
            settled(psub, name, ep, 50, deadline)
            psub.seek(subscription=name, snapshot=snap)  # to the snapshot: the 10 published since
            settled(psub, name, ep, 60, deadline)
            psub.seek(subscription=name, time=time.time() + 3600)  # forward: nothing comes back
            third = pub.publish_batch(topic, [{"data": b"c"}])
            settled(psub, name, ep, 61, deadline)
            time.sleep(1.5)  # a few more batches: nothing else may arrive
        finally:
            stop.set()
            job.join(60)
        expected = collections.Counter({**{m: 2 for m in first}, **{m: 2 for m in second}, **{m: 1 for m in third}})
        assert pushed(ep) == expected
