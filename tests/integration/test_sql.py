"""SQL over real tables: the views answer with Pub/Sub's field names and fresh data."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

import deltabus.spark
from deltabus.errors import WarehouseNotFound
from deltabus.spark.sql_shell import repl, split_statements, take_statements
from tests import background
from tests.background import in_warehouse
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
    assert split_statements("select 'it\\'s;' as a; -- a comment; still\nselect 2 /* ; */") == [
        "select 'it\\'s;' as a",
        "-- a comment; still\nselect 2 /* ; */",
    ]
    assert split_statements("select 1; -- only a comment") == ["select 1"]
    # The prompt keeps the unfinished rest for the next line.
    assert take_statements("select 1;\nselect\n") == (["select 1"], "\nselect\n")
    assert take_statements("select ';") == ([], "select ';")


def _lines(text: str):
    it = iter(text.splitlines())
    return lambda prompt: next(it, None)


def test_repl_runs_statements_and_survives_errors(spark, pub, topic, warehouse):
    pub.publish_batch(topic, [{"data": b"x"}] * 3)
    s = deltabus.spark.session(warehouse, spark=spark)
    out: list[str] = []
    errors: list[str] = []
    repl(
        s,
        _lines("select count(*) as n\n from messages;\nselect nope from nowhere;\nselect 2 as two; select 3 as three;\nquit\nselect 4 as four;"),
        rows=10,
        say=out.append,
        say_error=errors.append,
    )
    text = "\n".join(out)
    assert "|n  |" in text and "|3  |" in text and "|two|" in text and "|three|" in text
    assert "four" not in text  # nothing runs after quit
    assert len(errors) == 1 and errors[0].startswith("error: [TABLE_OR_VIEW_NOT_FOUND]") and "\n" not in errors[0]


def test_repl_runs_a_last_statement_without_semicolon_at_eof(spark, pub, warehouse):
    s = deltabus.spark.session(warehouse, spark=spark)
    out: list[str] = []
    repl(s, _lines("select 41 + 1 as answer"), rows=10, say=out.append)
    assert "|42    |" in "\n".join(out)


def _sql_warehouse(pub, topic) -> None:
    pub.publish_batch(topic, [{"data": b"x"}] * 3)


def sql_prompt_reads_piped_statements_through_spark_submit(pub, topic, warehouse, _tmp):
    """spark-submit gives the Python driver a stdin pipe of its own that nobody writes to:
    the prompt must read the user's pipe, not hang on that one."""
    _sql_warehouse(pub, topic)
    script = "select count(*) as n\n  from messages;\nselect nope from nowhere;\nselect 'a;b' as s; -- done\nquit\nselect 'after quit' as s;\n"
    proc = subprocess.run(
        [str(ROOT / "spark-submit.sh"), "jobs/sql.py", "--warehouse", warehouse],
        cwd=ROOT, input=script, capture_output=True, text=True, timeout=240,
    )
    out = proc.stdout + proc.stderr  # spark-submit merges the driver's stderr into its stdout anyway
    assert proc.returncode == 0, out[-3000:]
    assert "|n  |" in out and "|3  |" in out and "|a;b|" in out
    assert "after quit" not in out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "TABLE_OR_VIEW_NOT_FOUND" in errors[0]
    assert "Traceback" not in out and "SQLQueryContextLogger" not in out and "deltabus-sql>" not in out


class _Pty:
    """A terminal for a child process: what it prints is read back, lines are typed into it."""

    def __init__(self, argv: list[str], cwd, env) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 180.0) -> str:
        end = time.monotonic() + timeout
        while text not in self.seen:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{text!r} never appeared; the terminal showed:\n{self.seen[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], min(left, 1.0))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk and self.proc.poll() is not None:
                    raise AssertionError(f"exited {self.proc.returncode} before {text!r}:\n{self.seen[-3000:]}")
                self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        at = self.seen.index(text) + len(text)
        before, self.seen = self.seen[:at], self.seen[at:]
        return before

    def wait_exit(self, timeout: float) -> int | None:
        """Read what is left (so the child never blocks on a full terminal) until it exits."""
        end = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < end:
            if select.select([self.master], [], [], 0.2)[0]:
                try:
                    self.seen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:
                    pass
        return self.proc.poll()

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


def sql_prompt_on_a_terminal_through_spark_submit(pub, topic, warehouse, _tmp):
    _sql_warehouse(pub, topic)
    env = dict(background.env(), TERM="dumb")
    term = _Pty([str(ROOT / "spark-submit.sh"), "jobs/sql.py", "--warehouse", warehouse], ROOT, env)
    try:
        assert "End each statement with ';'" in term.expect("deltabus-sql> ")
        term.type("select count(*) as n")
        term.expect("-> ")  # a statement goes on until its ';'
        term.type("  from messages;")
        shown = term.expect("deltabus-sql> ")
        assert "|n  |" in shown and "|3  |" in shown
        term.type("select nope from nowhere;")
        shown = term.expect("deltabus-sql> ")
        errors = [line for line in shown.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "TABLE_OR_VIEW_NOT_FOUND" in errors[0] and "Traceback" not in shown
        term.type("quit")
        assert term.wait_exit(timeout=120) == 0
    finally:
        term.close()


# The two spark-submit prompts (~25 s each, a JVM start apiece) run in the background from the
# session's first test on (tests/background.py); each test below checks its own run, with its own warehouse.
SCENARIOS = {
    "test_sql_prompt_reads_piped_statements_through_spark_submit": in_warehouse(sql_prompt_reads_piped_statements_through_spark_submit),
    "test_sql_prompt_on_a_terminal_through_spark_submit": in_warehouse(sql_prompt_on_a_terminal_through_spark_submit),
}


BACKGROUND = SCENARIOS  # started by the session's first test (tests/background.py)


def test_sql_prompt_reads_piped_statements_through_spark_submit(early_background):
    """spark-submit gives the Python driver a stdin pipe of its own that nobody writes to:
    the prompt must read the user's pipe, not hang on that one."""
    early_background.result("test_sql_prompt_reads_piped_statements_through_spark_submit")


def test_sql_prompt_on_a_terminal_through_spark_submit(early_background):
    early_background.result("test_sql_prompt_on_a_terminal_through_spark_submit")


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


def test_sql_job_reports_a_missing_script_in_one_line_before_starting_spark(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "sql.py"), "-f", str(tmp_path / "missing.sql")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [f"error: -f {tmp_path / 'missing.sql'}: No such file or directory"]


def test_session_on_a_missing_warehouse_is_not_found_and_creates_nothing(spark, tmp_path):
    missing = str(tmp_path / "typo")
    with pytest.raises(WarehouseNotFound, match="no warehouse at"):
        deltabus.spark.session(missing, spark=spark)
    assert not os.path.exists(missing)
    # Explicit set-up (a notebook's fresh warehouse) creates it, and the views answer.
    s = deltabus.spark.session(missing, spark=spark, create=True, refresh_backlog=False)
    assert s.sql("select count(*) from topics").collect()[0][0] == 0


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


@pytest.mark.cluster  # the cluster-engine group: minutes of delta-spark reads here
def test_on_delta_spark_the_views_read_through_sparks_delta_reader(spark, pub, sub, topic, subscription, warehouse):
    """With the Delta jars the views are Spark's own Delta scans (not the delta-rs Python
    source), and they answer exactly what the delta-rs reader answers over the same tables."""
    from tests.conftest import requires_delta

    from deltabus.spark.sql import register

    requires_delta(spark)
    ids = pub.publish_batch(topic, [{"data": f"m{i}".encode(), "attributes": {"i": str(i)}} for i in range(5)])
    got = sub.pull(subscription=subscription, max_messages=2, return_immediately=True).received_messages
    sub.acknowledge(subscription=subscription, ack_ids=[got[0].ack_id])
    # Outstanding for the whole test, however slow the machine (the fixture's deadline is 10 s).
    sub.modify_ack_deadline(subscription=subscription, ack_ids=[got[1].ack_id], ack_deadline_seconds=600)
    sub.refresh_backlog()
    queries = {
        "messages": "select message_id, data, attributes['i'] as i, topic from messages order by message_id",
        "deliveries": "select subscription, message_id, delivery_attempt, state from deliveries order by message_id",
        "subscriptions": "select name, topic, ack_deadline_seconds from subscriptions",
        "backlog": "select subscription, num_undelivered_messages, num_outstanding_messages from backlog",
    }

    def answers() -> dict[str, list]:
        return {name: [tuple(r) for r in spark.sql(q).collect()] for name, q in queries.items()}

    assert register(spark, warehouse, engine="delta-rs") == "delta-rs"
    assert "FileIndex" not in _plan(spark.sql(queries["messages"]))
    by_rs = answers()
    assert register(spark, warehouse, engine="delta-spark") == "delta-spark"
    for name, q in queries.items():
        plan = _plan(spark.sql(q))
        assert "DeltaFileIndex" in plan or "TahoeLogFileIndex" in plan, (name, plan)
        assert "PythonDataSource" not in plan and "deltabus_table" not in plan, (name, plan)
    by_spark = answers()
    assert by_spark == by_rs
    assert sorted(m[0] for m in by_spark["messages"]) == sorted(ids)
    assert sorted(d[3] for d in by_spark["deliveries"]) == ["outstanding"] + ["undelivered"] * 3  # the acked one is gone
    # Each query reads the latest version through Delta too.
    pub.publish_batch(topic, [{"data": b"late"}])
    assert spark.sql("select count(*) from messages").collect()[0][0] == 6
