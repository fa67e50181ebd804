"""The process's log watcher: waiters wake soon after a commit from another thread or
process, an idle wait ends at its timeout, and nothing spins while nobody waits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltabus import watch
from deltabus.watch import LogWatcher, local_log_dir, newest_local_version

ROW = pa.table({"x": [1]})


@pytest.fixture
def table(tmp_path) -> str:
    uri = str(tmp_path / "t")
    write_deltalake(uri, ROW)
    return uri


def _version(uri: str):
    return lambda: DeltaTable(uri).version()


def test_local_log_is_followed_by_stat(table, tmp_path):
    assert local_log_dir("s3://b/t") is None
    assert local_log_dir("file://" + table) == local_log_dir(table) == os.path.join(table, "_delta_log")
    assert newest_local_version(local_log_dir(table), 0) == 0
    write_deltalake(table, ROW, mode="append")
    write_deltalake(table, ROW, mode="append")
    assert newest_local_version(local_log_dir(table), 0) == 2


def test_a_waiter_wakes_soon_after_another_thread_commits(table):
    lw = LogWatcher()
    lw.watch(table, _version(table))
    seen = lw.current([table])
    committed: list[float] = []

    def commit() -> None:
        time.sleep(0.2)
        write_deltalake(table, ROW, mode="append")
        committed.append(time.monotonic())

    writer = threading.Thread(target=commit)
    writer.start()
    assert lw.wait_newer(seen, timeout=5.0)
    woke = time.monotonic()
    # The waiter may wake before write_deltalake has returned (the version file is there
    # first): wait for the writer before comparing, so the test does not race it.
    writer.join(10)
    assert committed and woke - committed[0] < 0.3  # 20 ms polls; slack for a loaded machine
    assert lw.current([table]) == {table: 1}


def test_a_waiter_wakes_soon_after_another_process_commits(table):
    lw = LogWatcher()
    lw.watch(table, _version(table))
    seen = lw.current([table])
    script = (
        "import time, pyarrow as pa; from deltalake import write_deltalake; "
        f"write_deltalake({table!r}, pa.table({{'x': [2]}}), mode='append'); print(time.time())"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert lw.wait_newer(seen, timeout=30.0)
        woke = time.time()
    finally:
        out, _ = child.communicate(timeout=30)
    assert woke - float(out.strip()) < 0.3


def test_an_idle_wait_ends_at_its_timeout_without_spinning(table):
    lw = LogWatcher()
    lw.watch(table, _version(table))
    seen = lw.current([table])
    t0 = time.monotonic()
    assert lw.wait_newer(seen, timeout=0.3) is False
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 0.45
    assert lw.wakeups <= 2  # waited once, not in a loop
    assert lw.polls <= 0.3 / watch.LOCAL_INTERVAL + 3  # one stat pass per interval, no more
    parked = lw.polls
    time.sleep(0.2)
    assert lw.polls <= parked + 1  # nobody waits: the thread is parked


def test_cancel_ends_a_wait_and_a_remote_table_is_read_at_its_interval():
    versions = [0]
    reads = []

    def read() -> int:
        reads.append(time.monotonic())
        return versions[0]

    lw = LogWatcher(remote_interval=0.1)
    uri = "s3://bucket/never/opened"
    lw.watch(uri, read)
    cancel = threading.Event()
    threading.Timer(0.1, cancel.set).start()
    t0 = time.monotonic()
    assert lw.wait_newer({uri: 0}, timeout=5.0, cancel=cancel) is False
    assert time.monotonic() - t0 < 0.3
    threading.Timer(0.15, lambda: versions.__setitem__(0, 1)).start()
    assert lw.wait_newer({uri: 0}, timeout=5.0)
    gaps = [b - a for a, b in zip(reads[1:], reads[2:])]
    assert gaps and min(gaps) >= 0.09  # an object store is not listed on every pass
    versions[0] = 2
    time.sleep(0.15)  # nobody waits, the thread is parked: current() reads a stale table itself
    assert lw.current([uri]) == {uri: 2}


def test_the_newest_registrant_reads_and_a_dropped_one_is_freed():
    import gc
    import weakref

    class Engine:  # stands for a client's engine: what a read_version closure holds
        def __init__(self, v: int) -> None:
            self.v = v

        def version(self) -> int:
            return self.v

    now = [0.0]
    lw = LogWatcher(remote_interval=1.0, clock=lambda: now[0])
    uri = "s3://bucket/t"
    old, new = Engine(3), Engine(5)
    assert lw.watch(uri, old.version) == 3
    gone = weakref.ref(old)
    assert lw.watch(uri, new.version) == 3  # the version is kept; the reader is replaced
    del old
    gc.collect()
    assert gone() is None  # the watcher no longer holds the first client's engine
    now[0] = 2.0
    assert lw.current([uri]) == {uri: 5}


def test_current_re_reads_a_re_created_local_table_at_the_resync_interval(table):
    import shutil

    now = [0.0]
    lw = LogWatcher(resync_interval=10.0, clock=lambda: now[0])
    write_deltalake(table, ROW, mode="append")
    assert lw.watch(table, _version(table)) == 1
    shutil.rmtree(table)
    write_deltalake(table, ROW)  # re-created: version 0, and no 2.json to stat
    assert lw.current([table]) == {table: 1}  # between resyncs only the next version is stat-ed
    now[0] = 10.0
    assert lw.current([table]) == {table: 0}  # a caller that never waits still resyncs


def test_the_thread_logs_a_tables_first_read_failure_once(caplog):
    calls = [0]

    def read() -> int:
        calls[0] += 1
        if calls[0] == 1:
            return 0
        raise OSError("token=SECRET-VALUE refused")

    lw = LogWatcher(remote_interval=0.02)
    uri = "s3://bucket/failing"
    lw.watch(uri, read)
    with caplog.at_level("WARNING", logger="deltabus.watch"):
        assert lw.wait_newer({uri: 0}, timeout=0.3) is False
    assert calls[0] >= 3  # retried on every pass
    logged = [r.getMessage() for r in caplog.records if r.name == "deltabus.watch"]
    assert len(logged) == 1 and uri in logged[0] and "OSError" in logged[0]
    assert "SECRET" not in logged[0]  # the error's type only, never its text


def test_one_watcher_per_process(monkeypatch):
    first = watch.watcher()
    assert watch.watcher() is first
    real = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real + 1)  # as in a forked child
    assert watch.watcher() is not first


def test_a_blocking_pull_wakes_on_publish_and_an_idle_one_returns_at_its_timeout(pub, sub, topic, subscription):
    t0 = time.monotonic()
    assert sub.pull(subscription=subscription, max_messages=1, timeout=0.6).received_messages == []
    assert 0.6 <= time.monotonic() - t0 < 1.5
    published: list[float] = []

    def publish() -> None:
        time.sleep(0.3)
        pub.publish_batch(topic, [{"data": b"x"}])
        published.append(time.monotonic())

    threading.Thread(target=publish).start()
    got = sub.pull(subscription=subscription, max_messages=1, timeout=10).received_messages
    assert len(got) == 1
    assert time.monotonic() - published[0] < 0.4  # woken by the commit, not by a 0.5 s re-check


def test_commits_of_other_topics_do_not_make_a_waiting_pull_spin(pub, sub, topic, subscription):
    other = pub.topic_path("local", "busy-topic")
    pub.create_topic(name=other)
    reads = []
    real = sub._pull_received

    def counted(*args, **kwargs):
        reads.append(time.monotonic())
        return real(*args, **kwargs)

    sub._pull_received = counted
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            pub.publish_batch(other, [{"data": b"noise"}])

    noise = threading.Thread(target=busy)
    noise.start()
    try:
        assert sub.pull(subscription=subscription, max_messages=1, timeout=1.0).received_messages == []
    finally:
        stop.set()
        noise.join()
    from deltabus.subscriber.client import MIN_RECHECK

    assert len(reads) <= 1.0 / MIN_RECHECK + 2  # woken by every commit, read at most every MIN_RECHECK
