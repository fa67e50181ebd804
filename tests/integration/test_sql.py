"""SQL over real tables: the views answer with Pub/Sub's field names and fresh data."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

import deltabus.spark
from deltabus.spark.sql_shell import repl, split_statements
from tests.conftest import ROOT, ManualClock

pytestmark = pytest.mark.spark


def test_views_answer_with_pubsub_fields(spark, pub, sub, topic, subscription, warehouse):
    other = sub.subscription_path("local", "other-sub")
    sub.create_subscription(name=other, topic=topic, push_config={"push_endpoint": "https://example.com/push"}, labels={"team": "data"})
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode(), "attributes": {"i": str(i)}, "ordering_key": "k"} for i in range(6)])
    got = sub.pull(subscription=subscription, max_messages=2, return_immediately=True).received_messages
    sub.acknowledge(subscription=subscription, ack_ids=[got[0].ack_id])
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[1].ack_id], ack_deadline_seconds=0)
    sub.refresh_backlog()

    s = deltabus.spark.session(warehouse, spark=spark)
    rows = s.sql("select subscription, num_undelivered_messages, oldest_unacked_message_age from backlog order by 2 desc").collect()
    assert [(r.subscription, r.num_undelivered_messages) for r in rows] == [(other, 6), (subscription, 4)]

    subs = {r.name: r for r in s.sql("select * from subscriptions").collect()}
    assert subs[other].push_config.push_endpoint == "https://example.com/push" and subs[other].labels == {"team": "data"}
    assert subs[subscription].ack_deadline_seconds == 10 and subs[subscription].topic == topic

    msgs = s.sql("select message_id, data, attributes['i'] i, ordering_key, publish_time, topic from messages").collect()
    assert sorted(m.message_id for m in msgs) == sorted(ids)
    assert all(bytes(m.data) == f"m{m.i}".encode() and m.ordering_key == "k" and m.topic == topic for m in msgs)

    states = dict(s.sql(f"select state, count(*) from deliveries where subscription = '{subscription}' group by state").collect())
    assert states == {"nacked": 1, "undelivered": 4}  # the acked one is gone

    # Views read the latest data at query time.
    pub.publish_batch(topic, [{"data": b"late"}])
    assert s.sql("select count(*) from messages").collect()[0][0] == 7
    assert deltabus.spark.session(warehouse, spark=spark) is spark


def test_deleted_topic_shows_in_subscriptions(spark, pub, sub, topic, subscription, warehouse):
    pub.delete_topic(topic=topic)
    s = deltabus.spark.session(warehouse, spark=spark)
    assert s.sql("select topic from subscriptions").collect()[0][0] == "_deleted-topic_"


def test_statement_splitting():
    assert split_statements("select 1; select ';' as x ;\n") == ["select 1", "select ';' as x"]
    assert split_statements("  ") == []


def test_repl_runs_statements_and_survives_errors(spark, pub, topic, warehouse):
    pub.publish_batch(topic, [{"data": b"x"}] * 3)
    s = deltabus.spark.session(warehouse, spark=spark)
    out: list[str] = []
    repl(s, io.StringIO("select count(*) as n\n from messages;\nselect nope from nowhere;\nexit;\n"), rows=10, say=out.append)
    text = "\n".join(out)
    assert "|n  |" in text and "|3  |" in text
    assert any(line.startswith("error:") for line in out)


def test_sql_job_help():
    out = subprocess.run([sys.executable, str(ROOT / "jobs" / "sql.py"), "--help"], capture_output=True, text=True, check=True)
    assert "--execute" in out.stdout and "--warehouse" in out.stdout


def test_a_new_session_shows_a_current_backlog_and_keeps_the_push_jobs_figures(spark, pub, sub, topic, subscription, warehouse):
    from deltabus import backlog as backlog_mod
    from deltabus.storage import open_engine

    pusher = sub.subscription_path("local", "pushed")
    sub.create_subscription(name=pusher, topic=topic, push_config={"push_endpoint": "https://example.com/push"})
    engine = open_engine(warehouse)
    # What a push job left behind: its counters and window for `pusher`.
    seeded = backlog_mod.compute(engine, sub._registry.subscription(pusher), time.time())
    from dataclasses import replace

    backlog_mod.write(engine, [replace(seeded, delivered=7, acked=6, nacked=1, push_window=5000, backoff_seconds=0.0)])
    pub.publish_batch(topic, [{"data": b"a"}, {"data": b"b"}])  # nobody refreshed the backlog since

    s = deltabus.spark.session(warehouse, spark=spark)
    rows = {r.subscription: r for r in s.sql("select * from backlog").collect()}
    assert rows[subscription].num_undelivered_messages == 2 and rows[subscription].push_window is None
    assert rows[pusher].num_undelivered_messages == 2
    assert (rows[pusher].delivered, rows[pusher].acked, rows[pusher].push_window) == (7, 6, 5000)
