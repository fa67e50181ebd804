"""exporter: the pending-batch files, the application id and which subscriptions export.
The exporting itself runs in the push job: tests/integration/test_delta_export.py."""

from __future__ import annotations

import pytest

from deltabus.push.exporter import EXPORT_BATCH, MAX_EXPORT_BATCHES, Pending, PendingFiles, app_id_for, export_budget, export_subscriptions
from deltabus.registry import SubscriptionRecord
from deltabus.types import DeltaConfig


def test_a_pending_batch_round_trips_and_clears(tmp_path):
    files = PendingFiles(str(tmp_path / "exports"))
    assert files.read("uid-1") is None
    files.write("uid-1", Pending(7, ("a", "b")))
    assert files.read("uid-1") == Pending(7, ("a", "b"))
    assert [p.name for p in (tmp_path / "exports").iterdir()] == ["uid-1.json"]  # no temporary file left
    files.clear("uid-1")
    files.clear("uid-1")  # twice: nothing to do
    assert files.read("uid-1") is None


def test_an_unreadable_pending_file_is_ignored(tmp_path):
    (tmp_path / "uid-2.json").write_text("{not json")
    assert PendingFiles(str(tmp_path)).read("uid-2") is None


def test_a_pending_file_of_the_wrong_shape_is_that_subscriptions_error_not_the_jobs(tmp_path):
    from deltabus.push.export_table import ExportError

    for doc in ('[1, 2]', '{"batch": "x", "ack_ids": []}', '{"ack_ids": []}', '{"batch": 3, "ack_ids": 5}'):
        (tmp_path / "uid-3.json").write_text(doc)
        with pytest.raises(ExportError, match="not a pending batch"):
            PendingFiles(str(tmp_path)).read("uid-3")


def test_a_pending_batch_keeps_its_table_and_nonce(tmp_path):
    files = PendingFiles(str(tmp_path))
    files.write("u", Pending(2, ("a",), "/t/a", "n1"))
    assert files.read("u") == Pending(2, ("a",), "/t/a", "n1")


def test_batch_numbers_start_at_1():
    with pytest.raises(ValueError):
        Pending(0, ())


def test_the_app_id_is_the_subscriptions_uid_and_the_jobs_checkpoint(tmp_path):
    one, other = str(tmp_path / "a" / "exports"), str(tmp_path / "b" / "exports")
    assert app_id_for("u1", one).startswith("deltabus-export-u1-")
    assert app_id_for("u1", one) == app_id_for("u1", one) != app_id_for("u2", one)
    assert app_id_for("u1", one) != app_id_for("u1", other)  # two jobs count their own batches


def _rec(name: str, uid: str, **kw: object) -> SubscriptionRecord:
    return SubscriptionRecord(name=f"projects/p/subscriptions/{name}", topic="projects/p/topics/top", sub_uid=uid,
                              topic_uid="t", start_version=0, create_time=None, update_time=None, **kw)  # type: ignore[arg-type]


def test_only_attached_subscriptions_with_a_delta_config_export():
    recs = {r.name: r for r in (_rec("exp", "u1", delta_config=DeltaConfig("/t")), _rec("pull", "u2"),
                                _rec("gone", "u3", delta_config=DeltaConfig("/t"), detached=True))}
    assert list(export_subscriptions(recs)) == ["u1"]


def test_a_batch_number_another_writer_recorded_is_not_acked(tmp_path, monkeypatch):
    """If the table already records the batch about to be appended (a second writer under this
    job's id), the exporter must not ack messages it did not append."""
    from deltabus import PublisherClient, SubscriberClient
    from deltabus.push import export_table
    from deltabus.push.exporter import DeltaExporter, ExportOutcome

    warehouse = str(tmp_path / "w")
    pub = PublisherClient(warehouse=warehouse)
    pub.create_topic(name="projects/p/topics/top")
    sub = SubscriberClient(warehouse=warehouse)
    rec_name = "projects/p/subscriptions/exp"
    sub.create_subscription(request={"name": rec_name, "topic": "projects/p/topics/top",
                                     "delta_config": {"table": str(tmp_path / "t")}})
    pub.publish_batch("projects/p/topics/top", [{"data": b"x"}])
    ex = DeltaExporter(sub.engine, str(tmp_path / "exports"), clock=__import__("time").time)
    monkeypatch.setattr(export_table, "append_once", lambda *a, **k: False)
    rec = {r.sub_uid: r for r in sub._registry.subscriptions().values()}
    out = ex.run(rec, 100).outcomes[next(iter(rec))]
    assert out == ExportOutcome(appended=0, acked=0, status="delta error", error=out.error) and "already recorded" in str(out.error)
    assert sub.get_backlog(rec_name).num_unacked_messages == 1
    left = PendingFiles(str(tmp_path / "exports")).read(next(iter(rec)))
    assert left is not None and left.ack_ids == ()  # settled (only the high-water mark): reconciling will not ack them
    ex.close()
    pub.stop()
    sub.close()


def test_each_run_starts_with_the_next_subscription_so_a_large_backlog_starves_none(tmp_path, monkeypatch):
    from deltabus.push.exporter import DeltaExporter

    ex = DeltaExporter.__new__(DeltaExporter)  # only the turn-taking: no client, no files
    ex._turn, ex._next, ex._warned = 0, {}, {}
    order: list[str] = []

    def export(rec, out, budget):  # type: ignore[no-untyped-def]
        order.append(rec.sub_uid)
        return budget  # takes the whole budget

    monkeypatch.setattr(ex, "_export", export)
    recs = {u: _rec(u, u, delta_config=DeltaConfig("/t")) for u in ("u1", "u2", "u3")}
    for _ in range(3):
        ex.run(recs, 100)
    assert order[0::3] == ["u1", "u2", "u3"]  # a different first each run


def test_a_failing_pending_file_write_is_logged_once_not_every_run(tmp_path, caplog):
    """The OSError branch logs once per new error, as the ExportError branch does."""
    import logging
    import time

    from deltabus import PublisherClient, SubscriberClient
    from deltabus.push.exporter import DeltaExporter

    warehouse = str(tmp_path / "w")
    pub = PublisherClient(warehouse=warehouse)
    pub.create_topic(name="projects/p/topics/top")
    sub = SubscriberClient(warehouse=warehouse)
    sub.create_subscription(request={"name": "projects/p/subscriptions/exp", "topic": "projects/p/topics/top",
                                     "delta_config": {"table": str(tmp_path / "t")}})
    pub.publish_batch("projects/p/topics/top", [{"data": b"x"}])
    (tmp_path / "exports").write_text("a file where the pending directory should be")
    ex = DeltaExporter(sub.engine, str(tmp_path / "exports"), clock=time.time)
    rec = {r.sub_uid: r for r in sub._registry.subscriptions().values()}
    with caplog.at_level(logging.WARNING, logger="deltabus.deliver"):
        for _ in range(3):
            out = ex.run(rec, 100).outcomes[next(iter(rec))]
            assert out.status == "delta error"
    assert sum("stopped this round" in r.getMessage() for r in caplog.records) == 1
    ex.close()
    pub.stop()
    sub.close()


def test_exports_get_what_the_pushes_left_at_least_a_quarter_and_a_bounded_number_of_batches():
    assert export_budget(0, 0) == 0  # the drain batch (no budget) exports nothing
    assert export_budget(8_000, 2_000) == 6_000  # what the pushes left
    assert export_budget(8_000, 8_000) == 2_000  # a full push batch still leaves exports a quarter
    assert export_budget(50_000, 0) == MAX_EXPORT_BATCHES * EXPORT_BATCH  # bounded micro-batch time
