"""Push backoff through the real push job: real aiohttp endpoints on 127.0.0.1, real Delta
tables, a local SparkSession and the push workers. Progress is counted in micro-batches
(``DeliveryJob.process`` calls), never timed."""

from __future__ import annotations

import base64
import json
import logging
import socket
import time

import pytest

from deltabus import config
from deltabus.push.job import DeliveryJob
from deltabus.storage.arrow import read_table
from tests.endpoints import Behaviour, Endpoint

pytestmark = pytest.mark.spark

TRIGGER = 0.2


def settings(warehouse):
    return config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=TRIGGER, backlog_interval=0.2, engine="delta-rs")


def index_of(r):
    return int(base64.b64decode(json.loads(r.body)["message"]["data"]))


def flaky(r, n):
    """1 message in 10 fails twice, then succeeds."""
    attempt = json.loads(r.body)["deliveryAttempt"]
    return (503 if index_of(r) % 10 == 0 and attempt <= 2 else 204), 0.0


def run_batches(job, until, max_batches):
    """Micro-batches at the trigger's pace until `until(batch)` holds; returns the batch count."""
    for batch in range(1, max_batches + 1):
        job.process(None, batch)
        if until(batch):
            return batch
        time.sleep(TRIGGER)
    return max_batches


def test_endpoint_failing_1_in_10_twice_needs_few_more_batches_than_a_healthy_one(spark, pub, psub, topic, warehouse):
    n = 1000
    with Endpoint(Behaviour(flaky)) as bad, Endpoint() as good:
        s_bad = psub.subscription_path("local", "flaky")
        s_good = psub.subscription_path("local", "healthy")
        psub.create_subscription(name=s_bad, topic=topic, push_config={"push_endpoint": bad.url})
        psub.create_subscription(name=s_good, topic=topic, push_config={"push_endpoint": good.url})
        ids = pub.publish_batch(topic, [{"data": str(i).encode()} for i in range(n)])
        job = DeliveryJob(spark, settings(warehouse))
        uids = {name: rec.sub_uid for name, rec in job.registry.subscriptions().items()}
        done: dict[str, int] = {}
        try:
            def finished(batch):
                for name in (s_bad, s_good):
                    if name not in done and job.state(uids[name]).acked == n:
                        done[name] = batch
                return len(done) == 2

            # Before the fix the flaky subscription's pause doubled to 60 s: 150 batches were not enough.
            run_batches(job, finished, max_batches=150)
            job.drain()
        finally:
            job.close()
        assert set(done) == {s_bad, s_good}, done
        assert {json.loads(r.body)["message"]["messageId"] for r in bad.snapshot()} == set(ids)
        from collections import Counter

        per_message = Counter(index_of(r) for r in bad.snapshot())
        # A message that acks is pushed once; a flaky one until its third attempt (an attempt can
        # also be used up without a send, by a lease that ends while its push waits in a worker).
        assert all(c == 1 for i, c in per_message.items() if i % 10), per_message
        assert all(1 <= c <= 3 for i, c in per_message.items() if i % 10 == 0), per_message
        assert len(good.snapshot()) == n
        # Both start from a window of 3; the flaky one retries 1 in 10 messages twice, each a
        # batch or two later, and its short pause (~0.4 s at 17 % nacks) skips a 0.2 s batch now and then.
        print("batches until all acked:", done)
        assert done[s_bad] <= 3 * done[s_good] + 5, done
        assert psub.get_backlog(s_bad).num_unacked_messages == psub.get_backlog(s_good).num_unacked_messages == 0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_failing_endpoints_are_named_in_the_log_and_the_backlog_without_secrets(spark, pub, psub, topic, warehouse, caplog, capsys):
    payload = "payload-must-not-be-logged"
    secret = "query-secret-hunter2"
    state = {"status": 503}
    with Endpoint(Behaviour(lambda r, n: (state["status"], 0.0))) as down:
        s_down = psub.subscription_path("local", "down-503")
        s_gone = psub.subscription_path("local", "refused")
        email = "pusher@local.iam.gserviceaccount.com"
        psub.create_subscription(name=s_down, topic=topic, push_config={
            "push_endpoint": f"{down.url}?token={secret}", "oidc_token": {"service_account_email": email}})
        psub.create_subscription(name=s_gone, topic=topic, push_config={
            "push_endpoint": f"http://127.0.0.1:{closed_port()}/push?key={secret}"})
        pub.publish_batch(topic, [{"data": payload.encode(), "attributes": {"a": payload}}] * 20)
        job = DeliveryJob(spark, settings(warehouse))
        uids = {name: rec.sub_uid for name, rec in job.registry.subscriptions().items()}
        caplog.set_level(logging.INFO, logger="deltabus")
        try:
            def both_failing(batch):
                return all(job.state(uids[s]).backoff.active and job.state(uids[s]).nacked >= 3 for s in (s_down, s_gone))

            run_batches(job, both_failing, max_batches=100)
            job.refresh_backlog(force=True)
            rows = {r["subscription"]: r for r in read_table(f"{warehouse}/backlog").to_pylist()}
            assert rows[s_down]["backoff_reason"] == "http 503" and rows[s_down]["last_status"] == "http 503"
            assert rows[s_gone]["backoff_reason"] == "connection refused" and rows[s_gone]["last_error"] == "connection refused"
            for s in (s_down, s_gone):
                assert rows[s]["backoff_seconds"] > 0 and rows[s]["backoff_until"] is not None

            # `deltabus backlog` prints the same.
            import io

            from deltabus import cli

            out = io.StringIO()
            assert cli.main(["--warehouse", warehouse, "backlog"], out=out) == 0, capsys.readouterr().err
            printed = {line.split()[0]: line for line in out.getvalue().splitlines() if line.startswith("projects/")}
            assert "http 503" in printed[s_down] and "connection refused" in printed[s_gone]

            state["status"] = 200  # the endpoint comes back
            recovered = f"push to {s_down} "

            def down_recovered(batch):
                return any(recovered in m and "recovered" in m for m in caplog.messages)

            run_batches(job, down_recovered, max_batches=150)
            job.drain()
        finally:
            job.close()
        assert psub.get_backlog(s_down).num_unacked_messages == 0
    text = "\n".join(caplog.messages)
    backing = [m for m in caplog.messages if "backing off" in m]
    down_line = next(m for m in backing if m.startswith(f"push to {s_down} (http://127.0.0.1:{down.port}/push): backing off"))
    assert "http 503 ×" in down_line and "nacked in the last 5 s" in down_line
    gone_line = next(m for m in backing if m.startswith(f"push to {s_gone} "))
    assert "connection refused ×" in gone_line
    assert any(m.startswith(f"push to {s_down} ") and "recovered" in m for m in caplog.messages)
    # No payload, attribute, query-string secret or token in any line.
    assert payload not in text and secret not in text and "Bearer" not in text and "eyJ" not in text
