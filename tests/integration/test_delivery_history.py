"""The delivery history (issue 17) on real Delta tables: one row per lease, ack, nack, expiry,
dead-lettering and push attempt, written by the commit that changed the delivery's state."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pyarrow as pa
import pytest

from deltabus.delivery import history, operations as ops
from deltabus.delivery.history import OFF
from deltabus.delivery.model import IdResult, Result
from deltabus.registry import Registry
from deltabus.retention import apply_retention, drop_old_history, sweep_deliveries
from deltabus.storage import open_engine
from deltabus.storage.delta_rs import DeltaRsEngine
from deltabus.storage.tables import HISTORY_PREFIX
from deltabus.timestamps import to_us
from tests.conftest import ManualClock

OK, BAD = Result.SUCCESS, Result.INVALID_ACK_ID


def rows_of(engine, subscription=None) -> list[tuple]:
    t = history.read(engine.snapshot("deliveries"), subscription)
    return list(zip(t["message_id"].to_pylist(), t["attempt"].to_pylist(), t["outcome"].to_pylist(), t["status"].to_pylist()))


def test_pull_ack_nack_expiry_and_stale_outcomes_are_recorded(warehouse, pub, topic, subscription) -> None:
    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    a, b, c = pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}, {"data": b"c"}])

    before = engine.version("deliveries")
    ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)
    assert engine.version("deliveries") == before + 1  # the leases' history rides in their commit
    assert sorted(rows_of(engine)) == [(m, 1, "lease", None) for m in sorted([a, b, c])]

    assert ops.acknowledge(engine, rec, [(a, 1)], clock=clock) == 1
    acked = engine.version("deliveries")
    assert ops.acknowledge(engine, rec, [(a, 1)], clock=clock) == 0  # again: a has no row left, so nothing is recorded
    assert ops.acknowledge(engine, rec, [("no-such-message", 1)], clock=clock) == 0  # nor for an id that names nothing
    assert engine.version("deliveries") == acked  # (Pub/Sub ignores both: nothing is written)
    assert ops.modify_deadline(engine, rec, [(b, 1)], 0, clock=clock) == 1  # a nack
    lease_end = clock() + 10
    clock.advance(11)  # c's lease runs out
    again = ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)
    assert sorted((l.message_id, l.delivery_attempt) for l in again) == sorted([(b, 2), (c, 2)])
    clock.advance(1)
    got = ops.acknowledge_results(engine, rec, [(b, 1)], clock=clock)  # an ack of b's first delivery: stale now
    assert got == [IdResult(b, 1, BAD)]

    assert Counter(rows_of(engine)) == Counter([
        (a, 1, "lease", None), (b, 1, "lease", None), (c, 1, "lease", None),
        (a, 1, "ack", None), (b, 1, "nack", None),
        (c, 1, "expired", None), (b, 2, "lease", None), (c, 2, "lease", None),
        (b, 1, "stale", "ack"),
    ])
    everything = history.read(engine.snapshot("deliveries"))
    expired = everything.filter(pa.compute.equal(everything["outcome"], "expired"))
    # An expiry is recorded when it is seen (the next lease), timed at the deadline that ran out.
    assert abs(expired["time"][0].as_py().timestamp() - lease_end) < 1.0

    # Delivery state and history cannot disagree: a message is gone from the subscription's
    # partition exactly when it has an ack row.
    left = set(engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid)["message_id"].to_pylist())
    acked = {m for m, _, o, _ in rows_of(engine) if o == "ack"}
    assert left == {b, c} and acked == {a}

    # Without history nothing is recorded, and nothing is read first (the old path).
    n = len(rows_of(engine))
    assert ops.acknowledge(engine, rec, [(b, 2)], history=OFF) == 1
    assert len(rows_of(engine)) == n


def test_dead_lettering_is_recorded_with_the_attempt_that_reached_the_limit(warehouse, pub, sub, topic) -> None:
    dead = pub.topic_path("local", "dead-letters")
    pub.create_topic(name=dead)
    name = sub.subscription_path("local", "dl-pull")
    sub.create_subscription(request={"name": name, "topic": topic, "ack_deadline_seconds": 10,
                                     "dead_letter_policy": {"dead_letter_topic": dead, "max_delivery_attempts": 5}})
    (m,) = pub.publish_batch(topic, [{"data": b"poison"}])
    for _ in range(5):
        (r,) = sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
        sub.modify_ack_deadline(subscription=name, ack_ids=[r.ack_id], ack_deadline_seconds=0)
    assert sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages == []
    got = rows_of(sub._engine, name)
    assert Counter(o for _, _, o, _ in got) == {"lease": 5, "nack": 5, "dead_lettered": 1}
    assert (m, 5, "dead_lettered", None) in got


def test_history_partitions_are_kept_out_of_sweeps_and_dropped_after_their_retention(warehouse, pub, topic, subscription) -> None:
    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    pub.publish_batch(topic, [{"data": b"a"}])
    ops.pull(engine, rec, max_messages=10, lease_seconds=10, clock=clock)
    # Ten days ago: a history row as an old pull would have written it.
    from deltabus.delivery.merge import commit
    old = history.rows(history.RECORD, subscription, pa.array(["x"]), pa.array([1], pa.int32()), "lease", to_us(clock() - 10 * 86400))
    engine.transact("deliveries", lambda snap: commit(snap, [old], [rec.sub_uid]), what="old history")
    parts = history.partitions(engine.snapshot("deliveries"))
    assert len(parts) == 2 and all(p.startswith(HISTORY_PREFIX) for p in parts)

    assert sweep_deliveries(engine, Registry(engine, clock=clock)) == 0  # no subscription's orphan
    with pytest.raises(Exception, match="history_retention_days"):
        drop_old_history(engine, clock(), -1)
    assert drop_old_history(engine, clock(), 30) == 0
    report = apply_retention(engine, clock=clock, history_retention_days=7)
    assert report["history_days_dropped"] == 1 and report["deliveries_orphans"] == 0
    assert history.partitions(engine.snapshot("deliveries")) == parts[1:]
    assert [o for _, _, o, _ in rows_of(engine)] == ["lease"]


def test_two_subscriptions_recording_history_concurrently_never_conflict(warehouse, pub, sub, topic) -> None:
    """Both write history to the same day partition in every commit; their MERGEs are pinned to
    their own partitions, so neither ever reruns (each conflict would sleep once)."""
    names = []
    for n in ("hist-one", "hist-two"):
        names.append(sub.subscription_path("local", n))
        sub.create_subscription(name=names[-1], topic=topic, ack_deadline_seconds=60)
    pub.publish_batch(topic, [{"data": b"%d" % i} for i in range(240)])
    conflicts: list[float] = []
    engines = [DeltaRsEngine(warehouse, sleep=conflicts.append, auto_compact=None) for _ in names]
    recs = [Registry(e, clock=time.time).subscription(n) for e, n in zip(engines, names)]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    spans: list[tuple[float, float]] = []

    def work(engine, rec) -> None:
        try:
            start.wait()
            began = time.monotonic()
            for _ in range(12):
                leases = ops.pull(engine, rec, max_messages=20, lease_seconds=60, clock=time.time)
                ops.acknowledge(engine, rec, [(l.message_id, l.delivery_attempt) for l in leases])
            spans.append((began, time.monotonic()))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(e, r)) for e, r in zip(engines, recs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert min(end for _, end in spans) > max(began for began, _ in spans)  # they did run at the same time
    assert conflicts == []  # zero reruns
    for engine, name in zip(engines, names):
        got = Counter(o for _, _, o, _ in rows_of(engine, name))
        assert got == {"lease": 240, "ack": 240}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.spark
def test_push_history_matches_what_the_endpoints_answered(spark, pub, psub, topic, warehouse) -> None:
    """A healthy, a flaky (every other answer of its first 7 is 503) and a dead (connection refused) endpoint: the
    history holds exactly the pushes they answered, every acked message has exactly one push_ok
    row, and every ended attempt was leased first."""
    from deltabus.push import runner
    from tests.endpoints import Behaviour, Endpoint
    from tests.integration.test_push import settings

    dead_topic = pub.topic_path("local", "to-a-dead-endpoint")
    pub.create_topic(name=dead_topic)
    flaky_answers = Behaviour(lambda r, n: (503 if n % 2 and n < 8 else 204, 0.0))
    with Endpoint() as healthy, Endpoint(flaky_answers) as flaky:
        subs = {}
        for name, url, on in (
            ("hist-healthy", healthy.url, topic),
            ("hist-flaky", flaky.url, topic),
            ("hist-dead", f"http://127.0.0.1:{free_port()}/push", dead_topic),
        ):
            subs[name] = psub.subscription_path("local", name)
            psub.create_subscription(name=subs[name], topic=on, push_config={"push_endpoint": url})
        published = pub.publish_batch(topic, [{"data": b"%d" % i} for i in range(12)])
        pub.publish_batch(dead_topic, [{"data": b"%d" % i} for i in range(5)])
        stop = threading.Event()
        job = threading.Thread(target=runner.run, args=(spark, settings(warehouse)), kwargs={"stop": stop, "max_seconds": 60})
        job.start()
        try:
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and any(
                psub.get_backlog(subs[n]).num_unacked_messages for n in ("hist-healthy", "hist-flaky")
            ):
                time.sleep(0.3)
        finally:
            stop.set()
            job.join()
        engine = psub._engine

        def outcomes(name):
            t = history.read(engine.snapshot("deliveries"), subs[name])
            return list(zip(t["message_id"].to_pylist(), t["attempt"].to_pylist(), t["outcome"].to_pylist(), t["status"].to_pylist(),
                            t["latency_ms"].to_pylist()))

        def state(name):  # the subscription's delivery rows: its unacked messages
            return set(engine.snapshot("deliveries").read(["message_id"], partition=psub._sub(subs[name]).sub_uid)["message_id"].to_pylist())

        ok = [r for r in outcomes("hist-healthy") if r[2] == "push_ok"]
        assert sorted(m for m, *_ in ok) == sorted(published)  # one push_ok per message, no more
        assert {r[3] for r in ok} == {"http 204"} and all(r[4] is not None and r[4] >= 0 for r in ok)
        assert Counter(r[2] for r in outcomes("hist-healthy")) == {"lease": 12, "push_ok": 12}

        got = outcomes("hist-flaky")
        answers = Counter(503 if n % 2 and n < 8 else 204 for n in range(1, len(flaky.snapshot()) + 1))
        assert Counter(r[3] for r in got if r[2] in ("push_ok", "push_failed")) == {f"http {s}": c for s, c in answers.items()}
        assert sorted(m for m, _, o, *_ in got if o == "push_ok") == sorted(published) and state("hist-flaky") == set()
        for name in subs:
            rows = outcomes(name)
            leased = Counter((m, a) for m, a, o, *_ in rows if o == "lease")
            ended = Counter((m, a) for m, a, o, *_ in rows if o in ("push_ok", "push_failed", "expired"))
            assert set(leased.values()) <= {1} and set(ended.values()) <= {1}  # one lease and one end per attempt
            assert set(ended) <= set(leased)  # every attempt that ended was leased first
            # State and history agree: a message left its partition exactly when it got a push_ok.
            seen = {m for m, *_ in rows}
            assert state(name) & seen == seen - {m for m, _, o, *_ in rows if o == "push_ok"}

        dead = outcomes("hist-dead")
        assert {o for _, _, o, *_ in dead} <= {"lease", "push_failed", "expired"} and any(o == "push_failed" for _, _, o, *_ in dead)
        assert {s for _, _, o, s, _ in dead if o == "push_failed"} == {"connection refused"}


def test_push_outcomes_of_two_attempts_of_one_message_in_one_commit_are_told_apart(warehouse, pub, topic, subscription) -> None:
    """Held outcomes pile up over paced commits, and an assignment given up on still reports
    late: one commit can carry an answer for attempt 1 (stale: the message was leased
    again) and one for attempt 2. Only the current attempt's may be recorded as applied:
    matching on the message id alone recorded the late ack as push_ok while the message,
    nacked by its current attempt, stayed unacked."""
    from deltabus.push import plan

    engine = open_engine(warehouse)
    clock = ManualClock(time.time())
    rec = Registry(engine, clock=clock).subscription(subscription)
    (m,) = pub.publish_batch(topic, [{"data": b"m"}])
    ops.pull(engine, rec, max_messages=1, lease_seconds=10, clock=clock)
    clock.advance(11)
    assert [(l.message_id, l.delivery_attempt) for l in ops.pull(engine, rec, max_messages=1, lease_seconds=10, clock=clock)] == [(m, 2)]

    def table(rows):  # type: ignore[no-untyped-def]
        return pa.table({
            "message_id": pa.array([r[0] for r in rows], pa.string()),
            "delivery_attempt": pa.array([r[1] for r in rows], pa.int32()),
            "outcome": pa.array([r[2] for r in rows], pa.string()),
            "status": pa.array([r[3] for r in rows], pa.int32()),
            "error": pa.array([""] * len(rows), pa.string()),
            "latency_seconds": pa.array([0.01] * len(rows), pa.float64()),
        })

    outcomes = {rec.sub_uid: (table([(m, 1, "ack", 204)]), table([(m, 2, "nack", 503)]))}
    empty = pa.table({"topic_uid": pa.array([], pa.string())})
    v = engine.version("messages")
    engine.transact("deliveries", lambda snap: plan.execute(
        engine, snap, [plan.SubPlan(rec, 0, lease_seconds=10.0)], outcomes, empty, v, v, now=clock(), batch_txn=None),
        what="push round")
    left = engine.snapshot("deliveries").read(["message_id"], partition=rec.sub_uid)["message_id"].to_pylist()
    assert left == [m]  # the nack of the current attempt applied; the late ack did not
    ends = sorted((a, o, s) for mid, a, o, s in rows_of(engine) if o not in ("lease", "expired"))
    assert ends == [(1, "stale", "push_ok http 204"), (2, "push_failed", "http 503")]
