"""storage.log_repair: a table whose _last_checkpoint names a missing checkpoint file (issue 16,
damaged state) opens from its log, or says which file to restore."""

from __future__ import annotations

import glob
import logging
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus import PublisherClient, SubscriberClient
from deltabus.errors import FailedPrecondition
from deltabus.storage.log_repair import drop_stale_hint, open_table


def table_with_two_checkpoints(uri: str) -> list[str]:
    for i in range(5):
        write_deltalake(uri, pa.table({"a": [i]}), mode="append")
    DeltaTable(uri).create_checkpoint()
    for i in range(5, 8):
        write_deltalake(uri, pa.table({"a": [i]}), mode="append")
    DeltaTable(uri).create_checkpoint()
    return sorted(glob.glob(f"{uri}/_delta_log/*.checkpoint.parquet"))


def test_a_hint_naming_a_missing_checkpoint_is_dropped_and_the_log_read(tmp_path, caplog):
    uri = str(tmp_path / "t")
    os.remove(table_with_two_checkpoints(uri)[-1])
    with pytest.raises(Exception, match="_last_checkpoint hint"):
        DeltaTable(uri)  # what every reader hit before
    with caplog.at_level(logging.WARNING, logger="deltabus.storage.log_repair"):
        dt = open_table(uri)
    assert dt.version() == 7 and sorted(dt.to_pyarrow_table()["a"].to_pylist()) == list(range(8))
    assert not os.path.exists(f"{uri}/_delta_log/_last_checkpoint")
    assert "checkpoint version 7" in caplog.text and "removed the hint" in caplog.text
    assert open_table(uri).version() == 7  # and it stays readable


def test_without_the_commits_before_it_the_error_names_the_file_to_restore(tmp_path):
    uri = str(tmp_path / "t")
    last = table_with_two_checkpoints(uri)[-1]
    for f in glob.glob(f"{uri}/_delta_log/*"):  # as a cleaned log: only what follows the last checkpoint
        name = os.path.basename(f)
        if name[:20].isdigit() and int(name[:20]) <= 7 and f != last:
            os.remove(f)
    os.remove(last)
    with pytest.raises(FailedPrecondition, match=r"checkpoint at version 7 is missing .*restore that checkpoint file from a backup"):
        open_table(uri)


def test_the_clients_read_a_warehouse_whose_checkpoints_were_removed(tmp_path):
    wh = str(tmp_path / "wh")
    pub, sub = PublisherClient(warehouse=wh), SubscriberClient(warehouse=wh)
    topic, name = pub.topic_path("p", "topic1"), sub.subscription_path("p", "sub1")
    pub.create_topic(name=topic)
    sub.create_subscription(name=name, topic=topic)
    ids = pub.publish_batch(topic, [{"data": b"x"}] * 3)
    sub.get_backlog(name)  # every table's handle open in these clients
    for t in ("messages", "deliveries", "subscriptions"):
        DeltaTable(f"{wh}/{t}").create_checkpoint()
        for f in glob.glob(f"{wh}/{t}/_delta_log/*.checkpoint.parquet"):
            os.remove(f)
    # The clients' handles, opened before, and fresh clients both read on.
    ids += pub.publish_batch(topic, [{"data": b"y"}])
    got = sub.pull(subscription=name, max_messages=10).received_messages
    assert sorted(m.message.message_id for m in got) == sorted(ids)
    sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in got])
    fresh = SubscriberClient(warehouse=wh)
    assert fresh.get_backlog(name).num_unacked_messages == 0


def test_drop_stale_hint_removes_only_a_hint_whose_checkpoint_is_gone(tmp_path):
    uri = str(tmp_path / "t")
    checkpoints = table_with_two_checkpoints(uri)
    assert drop_stale_hint(uri) is False and os.path.exists(f"{uri}/_delta_log/_last_checkpoint")
    os.remove(checkpoints[-1])
    assert drop_stale_hint(uri) is True and not os.path.exists(f"{uri}/_delta_log/_last_checkpoint")
    assert drop_stale_hint(uri) is False  # nothing left to mend
    assert DeltaTable(uri).version() == 7
