"""The push job end to end: real aiohttp endpoints on 127.0.0.1, real Delta tables, local Spark."""

from __future__ import annotations

import base64
import json
import threading
import time

import pyarrow as pa

import pytest

from deltabus import config
from deltabus.push import runner
from tests.endpoints import Behaviour, Endpoint
from deltabus.storage.arrow import read_table
from tests.conftest import requires_delta


pytestmark = pytest.mark.spark

# The push tests that matter most also run the job on delta-spark (the clients stay on
# delta-rs: both engines on one warehouse). Each costs real seconds there, so only these.
# Their delta-spark runs are in the `cluster` group (./run-tests.sh -m cluster, run by .ci/run):
# a delta-spark push job costs minutes here, past the main suite's 15-minute budget.
BOTH_ENGINES = pytest.mark.parametrize("engine", ["delta-rs", pytest.param("delta-spark", marks=pytest.mark.cluster)])


def pick_engine(spark, engine):
    if engine == "delta-spark":
        requires_delta(spark)
    return engine


def settings(warehouse, **kw):
    # The engine is pinned: the tests' session has the Delta jars, where "auto" means delta-spark.
    values = dict(warehouse=warehouse, allow_http=True, trigger_interval=0.2, backlog_interval=0.5, engine="delta-rs")
    values.update(kw)
    return config.Settings(**values)


def deliver(spark, warehouse, max_seconds=180, **kw):
    until_idle = kw.pop("until_idle", True)
    return runner.run(spark, settings(warehouse, **kw), until_idle=until_idle, max_seconds=max_seconds)


def ids_of(endpoint):
    return [json.loads(r.body)["message"]["messageId"] for r in endpoint.snapshot()]


@BOTH_ENGINES
def test_ten_thousand_messages_to_three_push_subscriptions(spark, pub, psub, topic, warehouse, engine):
    pick_engine(spark, engine)
    with Endpoint() as a, Endpoint() as b, Endpoint() as c:
        subs = []
        for name, ep in (("push-a", a), ("push-b", b), ("push-c", c)):
            s = psub.subscription_path("local", name)
            psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
            subs.append(s)
        published = []
        for start in range(0, 10_000, 1000):
            published += pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(start, start + 1000)])
        summary = deliver(spark, warehouse, engine=engine)
        assert summary.stopped_because == "nothing left to deliver or retry"
        for ep in (a, b, c):
            got = ids_of(ep)
            assert set(got) == set(published)  # nothing lost
            assert len(got) == len(published)  # and, with a healthy endpoint, nothing pushed twice
        for s in subs:
            assert psub.get_backlog(s).num_unacked_messages == 0
        assert summary.delivered == summary.acked == 30_000 and summary.nacked == 0


def expected_wrapped(sub, mid, data, attributes, publish_time, ordering_key, attempt):
    """Pub/Sub's wrapped body, written out independently of deltabus.push.body."""
    when = publish_time.strftime("%Y-%m-%dT%H:%M:%S") + (
        "" if publish_time.microsecond == 0
        else f".{publish_time.microsecond // 1000:03d}" if publish_time.microsecond % 1000 == 0
        else f".{publish_time.microsecond:06d}"
    ) + "Z"
    attrs = "" if not attributes else '"attributes":' + json.dumps(attributes, separators=(",", ":"), ensure_ascii=False) + ","
    okey = "" if not ordering_key else f',"orderingKey":{json.dumps(ordering_key)}'
    text = (
        '{"message":{"data":"' + base64.b64encode(data).decode() + '",' + attrs
        + f'"messageId":"{mid}","message_id":"{mid}","publishTime":"{when}","publish_time":"{when}"{okey}}},'
        + f'"subscription":"{sub}","deliveryAttempt":{attempt}}}'
    )
    return text.encode()


def test_wrapped_and_unwrapped_bodies_are_byte_exact(spark, pub, psub, topic, warehouse):
    from deltalake import DeltaTable


    with Endpoint() as wrapped_ep, Endpoint() as raw_meta, Endpoint() as raw_plain:
        s_wrapped = psub.subscription_path("local", "wrapped")
        s_meta = psub.subscription_path("local", "raw-meta")
        s_plain = psub.subscription_path("local", "raw-plain")
        psub.create_subscription(name=s_wrapped, topic=topic, push_config={"push_endpoint": wrapped_ep.url})
        psub.create_subscription(name=s_meta, topic=topic, push_config={"push_endpoint": raw_meta.url, "no_wrapper": {"write_metadata": True}})
        psub.create_subscription(name=s_plain, topic=topic, push_config={"push_endpoint": raw_plain.url, "no_wrapper": {"write_metadata": False}})
        pub.publish_batch(topic, [
            {"data": b"\x00binary\xff payload", "attributes": {"colour": "red", "size": "XL"}, "ordering_key": "customer-7"},
            {"data": "héllo".encode(), "attributes": {}},
            {"data": b"", "attributes": {"only": "attributes"}},
        ])
        deliver(spark, warehouse)
        rows = {r["message_id"]: r for r in read_table(f"{warehouse}/messages").to_pylist()}

        for r in wrapped_ep.snapshot():
            mid = json.loads(r.body)["message"]["messageId"]
            m = rows[mid]
            assert r.body == expected_wrapped(s_wrapped, mid, m["data"], dict(m["attributes"]), m["publish_time"], m["ordering_key"], 1)
            assert r.headers["Content-Type"] == "application/json"
        for r in raw_meta.snapshot():
            mid = r.headers["x-goog-pubsub-message-id"]
            m = rows[mid]
            assert r.body == m["data"]
            assert r.headers["x-goog-pubsub-subscription-name"] == s_meta
            assert r.headers["x-goog-pubsub-publish-time"].endswith("Z")
            assert r.headers.get("x-goog-pubsub-ordering-key", "") == m["ordering_key"]
            for k, v in dict(m["attributes"]).items():
                assert r.headers[k] == v
        assert sorted(r.body for r in raw_plain.snapshot()) == sorted(m["data"] for m in rows.values())
        assert all(not any(h.lower().startswith("x-goog-pubsub") for h in r.headers) for r in raw_plain.snapshot())
        assert len(wrapped_ep.snapshot()) == len(raw_meta.snapshot()) == len(raw_plain.snapshot()) == 3


@BOTH_ENGINES
def test_failing_endpoint_gets_backoff_and_redelivery_with_rising_attempts(spark, pub, psub, topic, warehouse, engine):
    pick_engine(spark, engine)
    failures = 3

    def respond(r, n):
        attempt = json.loads(r.body)["deliveryAttempt"]
        return (500 if attempt <= failures else 200), 0.0

    with Endpoint(Behaviour(respond)) as ep:
        s = psub.subscription_path("local", "flaky")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        (mid,) = pub.publish_batch(topic, [{"data": b"retry me"}])
        summary = deliver(spark, warehouse, engine=engine)
        got = ep.snapshot()
        attempts = [json.loads(r.body)["deliveryAttempt"] for r in got]
        assert attempts == [1, 2, 3, 4]
        assert {json.loads(r.body)["message"]["messageId"] for r in got} == {mid}
        gaps = [b.at - a.at for a, b in zip(got, got[1:])]
        # Backoff doubles from 100 ms (each pause is 50..100% of it), and a batch lies between tries.
        assert all(g >= 0.05 for g in gaps), gaps
        assert summary.nacked == 3 and summary.acked == 1
        assert psub.get_backlog(s).num_unacked_messages == 0


def test_backlog_table_shows_push_state(spark, pub, psub, topic, warehouse):
    from deltalake import DeltaTable

    with Endpoint(Behaviour(lambda r, n: (503, 0.0))) as ep:
        s = psub.subscription_path("local", "down")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        pub.publish_batch(topic, [{"data": b"x"}] * 5)
        # Until the endpoint has refused all five (not for a fixed time: on a loaded machine a
        # 4 s run ended before its first push); stopping merges what the workers reported.
        stop = threading.Event()

        def stop_after_five() -> None:
            deadline = time.time() + 120
            while len(ep.snapshot()) < 5 and time.time() < deadline:
                time.sleep(0.05)
            stop.set()

        threading.Thread(target=stop_after_five, daemon=True).start()
        runner.run(spark, settings(warehouse), until_idle=False, max_seconds=150, stop=stop)
        assert len(ep.snapshot()) >= 5
    (row,) = [r for r in read_table(f"{warehouse}/backlog").to_pylist() if r["subscription"] == s]
    assert row["nacked"] >= 3 and row["acked"] == 0 and row["delivered"] >= row["nacked"]
    assert row["backoff_seconds"] > 0 and row["push_window"] >= 1
    assert row["num_undelivered_messages"] + row["expired_ack_deadlines"] + row["num_outstanding_messages"] == 5


def test_endpoint_that_sleeps_past_the_deadline_is_redelivered_and_does_not_hold_others(spark, pub, psub, topic, warehouse):
    def slow(r, n):
        return 200, (12.0 if json.loads(r.body)["deliveryAttempt"] == 1 else 0.0)

    with Endpoint(Behaviour(slow)) as sleepy, Endpoint() as healthy:
        s_slow = psub.subscription_path("local", "sleepy")
        s_ok = psub.subscription_path("local", "healthy")
        psub.create_subscription(name=s_slow, topic=topic, ack_deadline_seconds=10, push_config={"push_endpoint": sleepy.url})
        psub.create_subscription(name=s_ok, topic=topic, push_config={"push_endpoint": healthy.url})
        started = time.time()
        (mid,) = pub.publish_batch(topic, [{"data": b"take your time"}])
        summary = deliver(spark, warehouse)
        attempts = [json.loads(r.body)["deliveryAttempt"] for r in sleepy.snapshot()]
        assert attempts == [1, 2]  # no answer within 10 s was a nack; the retry was acked
        first, second = sleepy.snapshot()
        assert second.at - first.at >= 9.5
        # The healthy subscription was served while the other one's push was hanging.
        (ok,) = healthy.snapshot()
        assert ok.at - started < first.at - started + 9
        assert summary.acked == 2 and psub.get_backlog(s_slow).num_unacked_messages == 0


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tokens_verify_against_the_served_jwks(spark, pub, psub, topic, warehouse):
    import threading
    import urllib.request

    import jwt

    email = "pusher@local.iam.gserviceaccount.com"
    with Endpoint() as default_aud, Endpoint() as custom_aud:
        s1 = psub.subscription_path("local", "auth-default")
        s2 = psub.subscription_path("local", "auth-custom")
        psub.create_subscription(name=s1, topic=topic, push_config={"push_endpoint": default_aud.url, "oidc_token": {"service_account_email": email}})
        psub.create_subscription(name=s2, topic=topic, push_config={"push_endpoint": custom_aud.url, "oidc_token": {"service_account_email": email, "audience": "https://my-service"}})
        pub.publish_batch(topic, [{"data": f"{i}".encode()} for i in range(20)])
        port = free_port()
        stop = threading.Event()
        job = threading.Thread(target=runner.run, args=(spark, settings(warehouse)),
                               kwargs={"jwks_port": port, "stop": stop, "max_seconds": 120})
        job.start()
        try:
            deadline = time.time() + 90
            while time.time() < deadline and (len(default_aud.snapshot()) < 20 or len(custom_aud.snapshot()) < 20):
                time.sleep(0.2)
            discovery = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/.well-known/openid-configuration"))
            keys = jwt.PyJWKClient(discovery["jwks_uri"])  # a standard JWKS verifier, fetching over HTTP
            for ep, audience in ((default_aud, default_aud.url), (custom_aud, "https://my-service")):
                got = ep.snapshot()
                assert len(got) == 20
                tokens = {r.headers["Authorization"].removeprefix("Bearer ") for r in got}
                assert len(tokens) == 1  # one token per (account, audience), reused
                token = tokens.pop()
                key = keys.get_signing_key_from_jwt(token)
                claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=audience, issuer=discovery["issuer"])
                assert claims["email"] == email and claims["email_verified"] is True
                assert claims["exp"] - claims["iat"] <= 3600 and claims["sub"] == claims["azp"]
                with pytest.raises(jwt.InvalidAudienceError):
                    jwt.decode(token, key.key, algorithms=["RS256"], audience="https://someone-else")
        finally:
            stop.set()
            job.join(60)
    import os
    import stat

    assert stat.S_IMODE(os.stat(f"{warehouse}/_keys/signing-key.pem").st_mode) == 0o600


def test_push_pull_push_switching_and_deletion(spark, pub, psub, topic, warehouse):
    with Endpoint() as ep, Endpoint() as gone:
        s = psub.subscription_path("local", "switcher")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        doomed = psub.subscription_path("local", "doomed")
        psub.create_subscription(name=doomed, topic=topic, push_config={"push_endpoint": gone.url})
        psub.delete_subscription(subscription=doomed)  # deleted: never pushed to

        a = pub.publish_batch(topic, [{"data": b"a"}] * 5)
        deliver(spark, warehouse)
        assert sorted(ids_of(ep)) == sorted(a)

        psub.modify_push_config(subscription=s, push_config={})  # now pull
        b = pub.publish_batch(topic, [{"data": b"b"}] * 5)
        deliver(spark, warehouse)
        assert sorted(ids_of(ep)) == sorted(a)  # B is not pushed
        got = psub.pull(subscription=s, max_messages=100, return_immediately=True).received_messages
        assert sorted(r.message.message_id for r in got) == sorted(b)
        psub.acknowledge(subscription=s, ack_ids=[r.ack_id for r in got])

        psub.modify_push_config(subscription=s, push_config={"push_endpoint": ep.url})  # push again
        c = pub.publish_batch(topic, [{"data": b"c"}] * 5)
        deliver(spark, warehouse)
        assert sorted(ids_of(ep)) == sorted(a + c)  # each once; nothing of A or B again
        assert gone.snapshot() == []


def test_plain_http_endpoints_need_allow_http(spark, pub, psub, topic, warehouse):
    with Endpoint() as ep:
        s = psub.subscription_path("local", "insecure")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        pub.publish_batch(topic, [{"data": b"x"}] * 3)
        summary = deliver(spark, warehouse, allow_http=False, max_seconds=20)
        assert ep.snapshot() == [] and summary.delivered == 0
        assert psub.get_backlog(s).num_unacked_messages == 3


@BOTH_ENGINES
def test_a_replayed_batch_is_skipped(spark, pub, psub, topic, warehouse, engine):
    from deltabus.push.job import DeliveryJob

    pick_engine(spark, engine)

    with Endpoint() as ep:
        s = psub.subscription_path("local", "replayed")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        pub.publish_batch(topic, [{"data": b"once"}])
        job = DeliveryJob(spark, settings(warehouse, engine=engine))
        try:
            first = job.process(None, 7)
            assert first.delivered == 1 and not first.skipped
            again = job.process(None, 7)  # Spark re-running batch 7 after a crash
            assert again.skipped and again.delivered == 0
            job.drain()
        finally:
            job.close()
        assert len(ep.snapshot()) == 1


def _stream_batch(engine, after: int) -> pa.Table:
    """The push stream's micro-batch of the messages-table versions after `after`, as the
    source hands it to the job: the messages with their ``version``, and the range covered."""
    from deltabus.storage.tables import MESSAGES

    last = engine.version(MESSAGES.name)
    rows = engine.snapshot(MESSAGES.name).changes(after + 1, last, ["topic_uid", "message_id", "publish_time", "ordering_key", "size_bytes"])
    rows = rows.rename_columns([*rows.column_names[:-1], "version"])
    return rows.append_column("range_start", pa.array([after] * rows.num_rows, pa.int64())).append_column(
        "range_end", pa.array([last] * rows.num_rows, pa.int64()))


def test_a_batch_fanning_out_a_burst_leases_nothing_once_and_leases_then_count_from_the_commit(spark, pub, psub, topic, warehouse):
    """More than FANOUT_LIMIT new messages in one micro-batch of the stream (a burst
    published within one trigger). A subscription catching up from its cursor fans out
    less than that per batch (test_fanout_catch_up.py)."""
    import pyarrow.compute as pc

    from deltabus.policy.lease_start import FANOUT_LIMIT
    from deltabus.push.job import DeliveryJob
    from deltabus.storage.tables import DELIVERIES, MESSAGES

    with Endpoint() as ep:
        s = psub.subscription_path("local", "catching-up")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url}, ack_deadline_seconds=30)
        job = DeliveryJob(spark, settings(warehouse))
        try:
            start = job.engine.version(MESSAGES.name)
            for n in range(0, FANOUT_LIMIT + 1, 1000):
                pub.publish_batch(topic, [{"data": b"x"}] * min(1000, FANOUT_LIMIT + 1 - n))
            batch = _stream_batch(job.engine, start)
            first = job.process(batch, 1)
            assert first.fanned_out == FANOUT_LIMIT + 1 and first.delivered == 0  # its commit would eat the leases
            extra = job.commit_times.allowance(30)
            assert extra > 0  # the first commit was timed
            # The bursts keep coming as fast: the next batch leases anyway (never twice in a row).
            start = int(pc.max(batch["range_end"]).as_py())
            for n in range(0, FANOUT_LIMIT + 1, 1000):
                pub.publish_batch(topic, [{"data": b"y"}] * min(1000, FANOUT_LIMIT + 1 - n))
            before = time.time()
            second = job.process(_stream_batch(job.engine, start), 2)
            assert second.fanned_out == FANOUT_LIMIT + 1 and second.delivered > 0
            leased = job.engine.snapshot(DELIVERIES.name).read(  # its partition: not the delivery history's
                columns=["lease_expires"], filter=pc.field("delivery_attempt") == 1, partition=psub._sub(s).sub_uid
            )
            ends = [t.timestamp() for t in leased["lease_expires"].to_pylist()]
            assert len(ends) == second.delivered
            assert min(ends) >= before + 30 + extra - 0.001  # the ack deadline, plus the commit's time
            job.drain()
        finally:
            job.close()


def test_a_push_subscription_catching_up_a_backlog_fans_out_what_its_window_can_take(spark, pub, psub, topic, warehouse):
    """A backlog published before the job: each batch fans out whole versions, a few times
    the window's room and never more than FANOUT_LIMIT (so every batch leases), until the
    cursor reaches the end; every message is pushed once."""
    from deltabus.policy.lease_start import FANOUT_LIMIT
    from deltabus.push.job import DeliveryJob

    with Endpoint() as ep:
        s = psub.subscription_path("local", "backlog")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url}, ack_deadline_seconds=60)
        published = []
        for _ in range(12):
            published += pub.publish_batch(topic, [{"data": b"x"}] * 1000)
        job = DeliveryJob(spark, settings(warehouse))
        held: list[bool] = []
        try:
            reports = []
            for i in range(1, 400):
                if len(ids_of(ep)) >= len(published):
                    break
                reports.append(job.process(None, i))
                held.append(job._held_leases)  # the batch fanned out so much it granted no leases
                time.sleep(0.02)
            job.drain()
        finally:
            job.close()
        fanning = [r for r in reports if r.fanned_out]
        assert len(fanning) >= 3 and sum(r.fanned_out for r in fanning) == len(published)  # over several batches
        assert max(r.fanned_out for r in fanning) <= FANOUT_LIMIT and not any(held)  # every batch could lease
        assert sorted(ids_of(ep)) == sorted(published) and len(ids_of(ep)) == len(published)

def test_several_push_subscriptions_catching_up_share_what_keeps_a_batch_leasing(pub, psub, topic):
    """Three push subscriptions lag on one backlog, each with room for 3,000: one batch's
    plan (push/plan.execute, on the real warehouse) fans out no more than FANOUT_LIMIT in
    all, so it grants leases; every batch after it does the same until all are fanned out."""
    from deltabus.policy.lease_start import FANOUT_LIMIT
    from deltabus.push.micro_batch import BATCH_COLUMNS
    from deltabus.push.plan import SubPlan, execute
    from deltabus.registry import Registry
    from deltabus.storage.tables import DELIVERIES, MESSAGES

    names = [psub.subscription_path("local", f"lagging-{i}") for i in range(3)]
    for name in names:
        psub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    published = []
    for _ in range(12):
        published += pub.publish_batch(topic, [{"data": b"x"}] * 1000)
    engine = psub.engine
    records = [Registry(engine, clock=time.time).subscription(n) for n in names]
    last = engine.version(MESSAGES.name)
    leased = 0
    for _ in range(20):
        plans = [SubPlan(rec, room=3000, lease_seconds=600) for rec in records]
        result = engine.transact(DELIVERIES.name, lambda snap: execute(
            engine, snap, plans, {}, BATCH_COLUMNS.empty_table(), last, last, now=time.time(), batch_txn=None,
            lease_fanout_limit=FANOUT_LIMIT), what="test batch")
        assert result.fanned_out <= FANOUT_LIMIT and not result.held_leases, result
        leased += sum(len(v) for v in result.leases.values())
        if not result.fanned_out and not result.leases:
            break
    assert leased == 3 * len(published)  # room 3,000 each, never refused: every message leased once
    for rec in records:  # its partition (not the delivery history's): each message once
        rows = engine.snapshot(DELIVERIES.name).read(columns=["message_id"], partition=rec.sub_uid)
        assert sorted(rows["message_id"].to_pylist()) == sorted(published)


def test_the_shared_catch_up_budget_turns_so_no_lagging_subscription_waits_behind_another(pub, psub, topic):
    """Three lagging push subscriptions with room 3,000 each: the first to take from
    FANOUT_LIMIT takes all of it, and the first changes with the batch id, so within three
    batches each has fanned out some of a backlog none could finish alone."""
    from deltabus.policy.lease_start import FANOUT_LIMIT
    from deltabus.push.micro_batch import BATCH_COLUMNS
    from deltabus.push.plan import SubPlan, execute
    from deltabus.registry import Registry
    from deltabus.storage.tables import DELIVERIES, MESSAGES

    names = [psub.subscription_path("local", f"turning-{i}") for i in range(3)]
    for name in names:
        psub.create_subscription(name=name, topic=topic, push_config={"push_endpoint": "http://127.0.0.1:9/push"})
    for _ in range(12):
        pub.publish_batch(topic, [{"data": b"x"}] * 1000)
    engine = psub.engine
    records = [Registry(engine, clock=time.time).subscription(n) for n in names]
    last = engine.version(MESSAGES.name)
    for batch_id in (1, 2, 3):
        plans = [SubPlan(rec, room=3000, lease_seconds=600) for rec in records]
        result = engine.transact(DELIVERIES.name, lambda snap: execute(
            engine, snap, plans, {}, BATCH_COLUMNS.empty_table(), last, last, now=time.time(),
            batch_txn=("test-turning", batch_id), lease_fanout_limit=FANOUT_LIMIT), what="test batch")
        assert result.fanned_out <= FANOUT_LIMIT and not result.held_leases, result
    fanned = [engine.snapshot(DELIVERIES.name).read(columns=["message_id"], partition=rec.sub_uid).num_rows for rec in records]
    assert all(n > 0 for n in fanned), fanned  # in a fixed order the third would still have nothing


def test_subscriptions_created_and_deleted_while_the_job_runs(spark, pub, psub, topic, warehouse):
    import threading

    with Endpoint() as early, Endpoint() as late:
        s_early = psub.subscription_path("local", "early")
        psub.create_subscription(name=s_early, topic=topic, push_config={"push_endpoint": early.url})
        stop = threading.Event()
        job = threading.Thread(target=runner.run, args=(spark, settings(warehouse)), kwargs={"stop": stop, "max_seconds": 120})
        job.start()
        try:
            first = pub.publish_batch(topic, [{"data": b"one"}] * 3)
            deadline = time.time() + 60
            while time.time() < deadline and len(early.snapshot()) < 3:
                time.sleep(0.1)
            s_late = psub.subscription_path("local", "late")
            psub.create_subscription(name=s_late, topic=topic, push_config={"push_endpoint": late.url})  # while running
            psub.delete_subscription(subscription=s_early)  # while running
            second = pub.publish_batch(topic, [{"data": b"two"}] * 3)
            while time.time() < deadline and len(late.snapshot()) < 3:
                time.sleep(0.1)
            time.sleep(1.5)  # a few more batches: nothing more may reach the deleted subscription
        finally:
            stop.set()
            job.join(60)
        assert sorted(ids_of(early)) == sorted(first)
        assert sorted(ids_of(late)) == sorted(second)  # its subscription point: only what came after
