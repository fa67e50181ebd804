"""The retry policy in the push job (issue 13): a real aiohttp endpoint answering 500, real
Delta tables, the push workers. A failed push is a nack, so the message waits its retry
delay; the subscription-wide push backoff still applies on top (it protects the endpoint)."""

from __future__ import annotations

import time

import pytest

from deltabus import config
from deltabus.push.job import DeliveryJob
from deltabus.types import RetryPolicy
from tests.endpoints import Behaviour, Endpoint

pytestmark = pytest.mark.spark

TRIGGER = 0.1
DELAY = 1.0


def gaps(received) -> list[float]:
    times = [r.at for r in received]
    return [b - a for a, b in zip(times, times[1:])]


def test_a_failing_push_is_retried_no_sooner_than_the_retry_delay(spark, pub, psub, topic, warehouse):
    failing = Behaviour(lambda r, n: (500, 0.0))
    with Endpoint(failing) as with_policy, Endpoint(failing) as without:
        s_policy = psub.subscription_path("local", "push-retry")
        s_plain = psub.subscription_path("local", "push-plain")
        psub.create_subscription(request={"name": s_policy, "topic": topic, "push_config": {"push_endpoint": with_policy.url},
                                          "retry_policy": RetryPolicy(DELAY, DELAY)})
        psub.create_subscription(name=s_plain, topic=topic, push_config={"push_endpoint": without.url})
        pub.publish_batch(topic, [{"data": b"poison"}])
        settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=TRIGGER, backlog_interval=5.0,
                                   engine="delta-rs")
        job = DeliveryJob(spark, settings)
        try:
            for batch in range(1, 400):
                job.process(None, batch)
                if len(with_policy.snapshot()) >= 3:
                    break
                time.sleep(TRIGGER)
        finally:
            job.close()
    spaced = gaps(with_policy.snapshot()[:3])
    assert len(spaced) == 2 and all(g >= DELAY for g in spaced), spaced
    # The same failures without a policy: only the push backoff (from 100 ms, doubling per
    # round) spaces them, so the first retry comes well before the policy's delay.
    plain = gaps(without.snapshot())
    assert len(plain) >= 2 and plain[0] < DELAY, plain
