"""The streaming source's ledger decisions (policy.stream_ledger), in Spark's call orders."""

from __future__ import annotations

import pytest

from deltabus.policy.stream_ledger import (
    PENDING,
    PLANNED,
    Ledger,
    LineageConflict,
    abandoned,
    absorb,
    acked,
    committed_by,
    drop,
    expire_unsettled,
    failed_after,
    idle_offer,
    new_batch,
    parts_of,
    plan,
    probe,
)


def test_normal_order_plans_then_acks_the_batch_before():
    ledger, n1 = new_batch(Ledger())
    assert n1 == 1 and ledger.pending == 1
    ledger, to_ack = plan(ledger, 0, 1)  # first batch: start is the initial offset
    assert to_ack == [] and ledger.batches == {1: PLANNED} and ledger.pending is None
    ledger, n2 = new_batch(ledger)
    assert committed_by(ledger, 1) == [1]  # commit(end=1) arrives when batch 2 is planned
    ledger = acked(ledger, 1, [], 100.0)
    ledger, to_ack = plan(ledger, 1, 2)
    assert to_ack == [] and ledger.batches == {2: PLANNED} and ledger.next == 3


def test_only_one_pending_batch_at_a_time():
    ledger, _ = new_batch(Ledger())
    with pytest.raises(ValueError, match="still pending"):
        new_batch(ledger)
    with pytest.raises(ValueError, match="more than one pending"):
        Ledger(next=3, batches={1: PENDING, 2: PENDING})


def test_restart_probe_keeps_the_newest_logged_batch_and_acks_the_chain_behind_it():
    ledger = Ledger(next=5, batches={2: PLANNED, 3: PLANNED, 4: PENDING}, links={2: 1, 3: 2})
    after, to_ack = probe(ledger, 3)  # batch 3 may be replayed; 2 (its link) was committed; 4 is an orphan
    assert to_ack == [2] and after == ledger and after.pending == 4
    # Spark's replay after the probe: the same (start, end) again, recognised by the link.
    after, to_ack = plan(acked(ledger, 2, [], 100.0), 2, 3)
    assert to_ack == [] and after.links == {3: 2} and after.batches == {3: PLANNED, 4: PENDING}
    # A batch logged by Spark but not planned before the crash becomes planned at the probe;
    # its link (and so what it commits) comes with the replay.
    ledger = Ledger(next=5, batches={3: PLANNED, 4: PENDING}, links={3: 2})
    after, to_ack = probe(ledger, 4)
    assert to_ack == [] and after.batches == {3: PLANNED, 4: PLANNED} and after.pending is None and 4 not in after.links
    after, to_ack = plan(after, 3, 4)
    assert to_ack == [3] and after.links == {3: 2, 4: 3}


def test_an_orphan_is_planned_as_the_next_batch_and_a_missing_one_is_an_error():
    ledger = Ledger(next=5, batches={3: PLANNED, 4: PENDING})
    after, to_ack = plan(ledger, 3, 4)
    assert to_ack == [3] and after.batches[4] == PLANNED
    with pytest.raises(LookupError, match="new checkpoint"):
        plan(ledger, 3, 2)  # acked and gone: the checkpoint is not this ledger's


def test_replay_plans_the_same_batch_again_and_another_start_is_refused():
    ledger = Ledger(next=4, batches={3: PLANNED}, links={3: 2})
    after, to_ack = plan(ledger, 2, 3)
    assert to_ack == [] and after == ledger
    with pytest.raises(LineageConflict, match="batch 3 was planned from offset 2 and is now planned from 0"):
        plan(ledger, 0, 3)  # a second checkpoint planning this one's batch
    with pytest.raises(ValueError, match="earlier offset"):
        plan(Ledger(next=5, batches={3: PENDING}), 4, 3)


def test_a_commit_acks_only_the_chain_of_its_own_checkpoint():
    """Checkpoint X planned 1 and 2, then stopped; checkpoint Y ran (3, 4) on the same
    consumer and stopped with 4 planned, not committed; X resumes and goes on with 5, 6.
    Neither X's plans nor its commits ack Y's batch 4, though it is numbered below them."""
    ledger, n = new_batch(Ledger())
    ledger, to_ack = plan(ledger, 0, n)  # X: (0, 1]
    ledger, n = new_batch(ledger)
    ledger, to_ack = plan(ledger, 1, n)  # X: (1, 2]; 1 committed
    assert to_ack == [1]
    ledger = acked(ledger, 1, [], 10.0)
    # Y starts from the initial offset: X's 2 is another lineage's (abandoned: nacked, dropped).
    ledger, n = new_batch(ledger)
    assert abandoned(ledger, 0, n) == [2]
    ledger, to_ack = plan(drop(ledger, [2]), 0, n)
    ledger, n = new_batch(ledger)
    ledger, to_ack = plan(ledger, 3, n)  # Y: (3, 4]; 3 committed
    assert to_ack == [3]
    ledger = acked(ledger, 3, [], 10.0)
    assert ledger.batches == {4: PLANNED} and ledger.links == {4: 3}
    # X resumes: the probe of its last offset (2, gone) acks nothing; it plans (2, 5].
    assert probe(ledger, 2) == (ledger, [])
    ledger, n = new_batch(ledger)
    assert committed_by(ledger, 2) == []
    ledger, to_ack = plan(ledger, 2, n)
    assert to_ack == [] and ledger.links == {4: 3, 5: 2}
    assert committed_by(ledger, 5) == [5]  # commit(5): not 4, which only Y could commit
    assert committed_by(ledger, 4) == [4]  # Y's own commit would
    # Planning past 5 releases Y's batch (nack, never ack): planned below, on no chain of X's.
    ledger, n = new_batch(ledger)
    assert abandoned(ledger, 5, n) == [4]
    ledger, to_ack = plan(drop(ledger, [4]), 5, n)
    assert to_ack == [5] and ledger.links == {5: 2, 6: 5}


def test_the_chain_goes_back_through_unacked_links_oldest_first_and_stops_at_a_gap():
    ledger = Ledger(next=9, batches={2: PLANNED, 3: PLANNED, 5: PLANNED, 7: PLANNED, 8: PENDING},
                    links={2: 1, 3: 2, 5: 3, 7: 6})
    assert committed_by(ledger, 5) == [2, 3, 5]  # an ack lost in a crash is redone with the next
    assert committed_by(ledger, 7) == [7]  # 6 is gone (acked): the chain ends there
    assert committed_by(ledger, 8) == [] and committed_by(ledger, 0) == [] and committed_by(ledger, 4) == []
    assert abandoned(ledger, 5, 8) == [7] and abandoned(ledger, 7, 8) == [2, 3, 5]
    # A planned batch with no link (a ledger from before links existed) is its own chain.
    assert committed_by(Ledger(next=4, batches={2: PLANNED, 3: PLANNED}), 3) == [3]


def test_a_failed_run_nacks_its_own_batches_after_its_last_completed_one():
    ledger = Ledger(next=8, batches={4: PLANNED, 5: PLANNED, 7: PENDING}, links={4: 3, 5: 2})
    assert failed_after(ledger, 2) == [5, 7]  # 4 is another checkpoint's (planned from 3)
    assert failed_after(ledger, 5) == [7]


def test_failed_acks_become_unsettled_until_they_expire():
    ledger = Ledger(next=3, batches={2: PLANNED})
    ledger = acked(ledger, 2, [("m1", 0)], 50.0)
    assert ledger.batches == {} and ledger.unsettled == {("m1", 0): 50.0}
    assert expire_unsettled(ledger, 49.0) is ledger
    assert expire_unsettled(ledger, 51.0).unsettled == {}


def test_absorb_never_emits_a_delivery_twice():
    leases = [("a", 0), ("b", 0), ("c", 0), ("a", 1)]
    out = absorb(leases, live={("a", 0): 3}, unsettled={("b", 0): 9.0})
    assert out.emit == [2, 3]  # ("a", 1): a seek made a new version, a genuine redelivery
    assert out.renewed == {("a", 0): 0} and out.ack_now == [1]


def test_keys_stay_in_one_part_in_order_and_keyless_rows_spread():
    keys = ["k1", "", "k2", "k1", "", "", "k1"]
    parts = parts_of(keys, 3)
    assert len({p for k, p in zip(keys, parts) if k == "k1"}) == 1
    assert [p for k, p in zip(keys, parts) if not k] == [0, 1, 2]
    assert parts_of(keys, 1) == [0] * len(keys)
    with pytest.raises(ValueError):
        parts_of(keys, 0)


def test_the_ledger_round_trips_through_json_and_refuses_nonsense():
    ledger = Ledger(next=7, batches={5: PLANNED, 6: PENDING}, unsettled={("m", 2): 10.5}, links={5: 0})
    assert Ledger.from_json(ledger.to_json()) == ledger
    legacy = {"next": 7, "batches": {"5": PLANNED}, "unsettled": []}  # written before links existed
    assert Ledger.from_json(legacy) == Ledger(next=7, batches={5: PLANNED})
    with pytest.raises(ValueError, match="not a planned batch"):
        Ledger(next=7, batches={5: PLANNED, 6: PENDING}, links={6: 5})
    with pytest.raises(ValueError, match="offset 0..4"):
        Ledger(next=7, batches={5: PLANNED}, links={5: 5})
    with pytest.raises(ValueError, match="outside"):
        Ledger(next=2, batches={3: PLANNED})
    with pytest.raises(ValueError, match="state"):
        Ledger(next=2, batches={1: "done"})
    with pytest.raises(ValueError, match="next"):
        Ledger(next=0)


def test_a_plan_from_the_initial_offset_abandons_an_older_checkpoints_batches():
    ledger = Ledger(next=6, batches={3: PLANNED, 4: PLANNED, 5: PENDING}, links={3: 2, 4: 3})
    assert abandoned(ledger, 0, 5) == [3, 4]  # a new checkpoint: nothing of it was committed before
    assert abandoned(ledger, 4, 5) == []  # the same lineage: 3 and 4 are committed (acked instead)
    after, to_ack = plan(drop(ledger, [3, 4]), 0, 5)
    assert after.batches == {5: PLANNED} and to_ack == [] and after.links == {5: 0}


def test_an_idle_latest_before_spark_says_where_it_is_makes_an_empty_batch():
    """Review S5: Trigger.AvailableNow calls latestOffset before initialOffset and the restart
    probe. Offering the ledger's newest planned batch then offered another (stopped)
    checkpoint's batch, and planning it from this query's offset was a LineageConflict."""
    # Checkpoint B (stopped) planned 5 from 4; this query (checkpoint A) is at offset 3, all committed.
    ledger = Ledger(next=6, batches={5: PLANNED}, links={5: 4})
    with pytest.raises(LineageConflict):
        plan(ledger, 3, ledger.newest_planned)  # what offering newest_planned led to
    assert idle_offer(ledger, None, newest_has_rows=False) is None  # so: a new, empty batch
    ledger, n = new_batch(ledger)
    assert n == 6 and abandoned(ledger, 3, n) == [5]  # B's batch is handed back, not acked
    after, to_ack = plan(drop(ledger, [5]), 3, n)
    assert to_ack == [] and after.batches == {6: PLANNED} and after.links == {6: 3}
    # A fresh checkpoint (planned from the initial offset) works the same way.
    assert plan(drop(ledger, [5]), 0, n)[0].links == {6: 0}
    # Once Spark has said where it is, an idle trigger offers that again...
    assert idle_offer(after, 6, newest_has_rows=False) == 6
    # ...unless the newest batch has rows and awaits the commit Spark sends when it plans the next.
    assert idle_offer(after, 6, newest_has_rows=True) is None
    assert idle_offer(Ledger(), 0, newest_has_rows=False) == 0


# -- the owner lock (deltabus.spark.streaming.OwnerLock): real files in a tmp dir --------------------
def _lock(directory, run, timeout=3.0):
    from deltabus.spark.streaming import OwnerLock

    return OwnerLock(str(directory), run, timeout, "consumer 'c' of projects/p/subscriptions/s")


def _owner_run(directory):
    import json

    return json.loads((directory / "owner.json").read_text())["run"]


def test_a_late_heartbeat_never_gives_the_lock_back_to_the_run_that_lost_it(tmp_path):
    """A is alive but its renewals stall past ownerTimeout (a slow fsync, say); B judges it
    stale, removes owner.json under the flock and links its own; then A's renewal lands. It
    must leave owner.json naming B (the review's race: A's rewrite of owner.json made two
    owners) and A must learn it lost before writing anything."""
    import os
    import time

    from deltabus.errors import FailedPrecondition

    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None and _owner_run(tmp_path) == "A"
    old = time.time() - 60
    os.utime(a.beat_path, (old, old))  # A's last renewal is older than ownerTimeout
    b = _lock(tmp_path, "B")
    assert b.try_acquire() is None and _owner_run(tmp_path) == "B"
    assert not os.path.exists(a.beat_path)  # removed with A's owner.json
    assert a.beat() is False and a.lost is not None and "taken over" in a.lost  # the late renewal
    assert _owner_run(tmp_path) == "B" and b.still_owner() and b.lost is None
    assert not os.path.exists(a.beat_path)  # a renewal never re-creates its file
    with pytest.raises(FailedPrecondition, match="consumer 'c' of projects/p/subscriptions/s was taken over"):
        with a.guard():
            pytest.fail("a run that lost the lock must not write")
    with b.guard():
        pass  # B writes
    a.release()  # A stopping late must not remove B's lock
    assert _owner_run(tmp_path) == "B" and b.beat()


def test_renewals_racing_a_takeover_leave_exactly_one_owner(tmp_path):
    """A renews in a tight loop (every renewal may be late) while racers try to take a lock
    whose heartbeat file looks stale: whoever wins, owner.json names one run from then on and
    every other run, A included, knows it is not the owner."""
    import os
    import threading
    import time

    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None
    stop = threading.Event()

    def renew():
        while not stop.is_set() and a.beat():
            old = time.time() - 60  # the renewal 'lands late': its file looks stale again at once
            try:
                os.utime(a.beat_path, (old, old))
            except FileNotFoundError:
                pass

    old = time.time() - 60
    os.utime(a.beat_path, (old, old))
    t = threading.Thread(target=renew)
    t.start()
    racers = [_lock(tmp_path, f"R{i}") for i in range(4)]
    results: dict[str, object] = {}

    def take(r):  # as _take_ownership: attempts until it wins, another racer holds it, or time is up
        deadline = time.time() + 5
        while time.time() < deadline:
            holder = r.try_acquire()
            results[r.run] = holder
            if holder is None or str(holder.get("run", "")).startswith("R"):
                return
            time.sleep(0.01)

    threads = [threading.Thread(target=take, args=(r,)) for r in racers]
    for x in threads:
        x.start()
    for x in threads:
        x.join(10)
    stop.set()
    t.join(10)
    winners = [r for r in racers if results[r.run] is None]
    assert len(winners) == 1 and _owner_run(tmp_path) == winners[0].run
    assert not a.beat() and _owner_run(tmp_path) == winners[0].run
    assert [r.still_owner() for r in racers].count(True) == 1


def test_the_heartbeat_interval_follows_the_owner_timeout():
    from deltabus.spark.streaming import heartbeat_interval

    assert heartbeat_interval(3.0) == 0.75 and heartbeat_interval(10.0) == 2.0 and heartbeat_interval(600.0) == 2.0


def test_a_guarded_write_and_a_takeover_exclude_each_other(tmp_path):
    """The owner re-read and the rename of state.json (or a manifest) happen under the flock a
    stale removal takes: a takeover waits for a write in progress, and a write after the
    takeover is refused and leaves the file and no temporary behind (review S1: a check, then
    an unlocked write, could land after the takeover)."""
    import json
    import os
    import threading
    import time

    import pyarrow as pa

    from deltabus.errors import FailedPrecondition
    from deltabus.spark.streaming import MANIFEST_SCHEMA, _write_json, write_manifest

    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None
    state = str(tmp_path / "state.json")
    _write_json(state, {"next": 1}, a.guard)
    old = time.time() - 60
    os.utime(a.beat_path, (old, old))  # A looks stale...
    b = _lock(tmp_path, "B")
    got: list[object] = []
    with a.guard():  # ...but is writing: B's removal waits for the flock
        t = threading.Thread(target=lambda: got.append(b.try_acquire()))
        t.start()
        time.sleep(0.3)
        assert _owner_run(tmp_path) == "A" and not got
        os.replace(state, state)  # the write A checked ownership for lands while it still owns
    t.join(10)
    assert got == [None] and _owner_run(tmp_path) == "B"
    with pytest.raises(FailedPrecondition, match="taken over"):
        _write_json(state, {"next": 99}, a.guard)
    with pytest.raises(FailedPrecondition, match="taken over"):
        write_manifest(str(tmp_path), 1, MANIFEST_SCHEMA.empty_table(), 10, a.guard)
    assert json.loads(open(state).read()) == {"next": 1} and not os.path.exists(tmp_path / "m-1")
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    write_manifest(str(tmp_path), 1, pa.Table.from_pylist([], MANIFEST_SCHEMA), 10, b.guard)
    assert os.path.isdir(tmp_path / "m-1")


def test_stop_keeps_the_heartbeat_while_the_leaser_runs_and_releases_only_its_own_lock(tmp_path):
    """Review S2: stop() ended the heartbeat at once while it waited up to 10 s for the
    leaser, so the lock went stale (and another run could take it) while a thread of this run
    still ran. Now the leaser is joined first and the heartbeat stopped last; the release
    re-reads owner.json under the flock."""
    import os
    import threading
    import time

    from deltabus.spark.streaming import StreamOptions, _Runtime

    rt = object.__new__(_Runtime)  # just the owner lock and the two threads (no warehouse)
    rt.opts = StreamOptions(warehouse=str(tmp_path), subscription="projects/p/subscriptions/sss", owner_timeout=3.0)
    rt.owner = _lock(tmp_path, "A")
    assert rt.owner.try_acquire() is None
    rt._stop, rt._stop_beat = threading.Event(), threading.Event()
    stuck = threading.Event()
    rt._thread = threading.Thread(target=lambda: (rt._stop.wait(), stuck.wait(20)))  # an extension stuck on storage
    rt._beater = threading.Thread(target=rt._beat)
    rt._thread.start()
    rt._beater.start()
    rt.STOP_JOIN_SECONDS = 0.2
    rt.stop()
    assert rt._thread.is_alive() and rt._beater.is_alive() and _owner_run(tmp_path) == "A"
    first = os.path.getmtime(rt.owner.beat_path)
    time.sleep(1.6)  # two renewals (every 0.75 s with ownerTimeout 3)
    assert os.path.getmtime(rt.owner.beat_path) > first and _owner_run(tmp_path) == "A"
    stuck.set()
    deadline = time.time() + 5
    # release() removes owner.json, then the heartbeat file: wait for both (CI once looked
    # between the two, on a loaded machine).
    while (os.path.exists(tmp_path / "owner.json") or os.path.exists(rt.owner.beat_path)) and time.time() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(tmp_path / "owner.json") and not os.path.exists(rt.owner.beat_path)
    assert not rt._beater.is_alive()


def test_the_failure_listener_leaves_a_later_owners_batches_alone(tmp_path):
    """Review S3: the listener passed the time it ran (asynchronous, maybe after a new run
    took the ledger) as the failed run's end, and the new run's "since" was set before it
    waited for the lock; the new run's live batches could be nacked. Now the failed run's
    last progress timestamp is compared with the owner's since, which is the time of the
    attempt that won."""
    import json
    import os
    import time

    from deltabus.policy.stream_ledger import Ledger
    from deltabus.spark.streaming import nack_failed, progress_time

    assert progress_time("2026-11-27T03:05:45.250Z", 0.0) == 1795748745.25
    assert progress_time("not a time", 7.0) == 7.0 and progress_time(None, 7.0) == 7.0
    directory = tmp_path / "_streams" / "uid" / "c"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(json.dumps(Ledger(next=3, batches={2: PENDING}).to_json()))
    old = _lock(directory, "old")
    assert old.try_acquire() is None
    last_progress = time.time()
    stale = time.time() - 60
    os.utime(old.beat_path, (stale, stale))
    new = _lock(directory, "new")
    assert new.try_acquire() is None and new.since is not None and new.since > last_progress
    # The failed run's batch 2 is the new run's now: nothing is nacked (no manifest or engine is read).
    assert nack_failed(str(tmp_path), "uid", "c", 1, last_progress) == 0


def test_since_is_the_time_of_the_attempt_that_won(tmp_path):
    import os
    import time

    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None
    b = _lock(tmp_path, "B")
    assert b.try_acquire() is not None and b.since is None  # A is alive: B waits
    time.sleep(0.05)
    freed = time.time()
    stale = time.time() - 60
    os.utime(a.beat_path, (stale, stale))
    assert b.try_acquire() is None and b.since is not None and b.since >= freed


def test_taking_the_lock_cleans_a_killed_owners_temporary_files_only(tmp_path):
    """A SIGKILL between a temporary file and its rename leaves it: the next owner removes
    state.json's and a manifest's, heartbeat files of runs gone long ago, and owner.json.tmp-*
    unchanged for ownerTimeout (a killed acquirer's, review nit); a waiting acquirer's fresh
    owner.json.tmp-* and heartbeat file stay (it still links and renews them)."""
    import os
    import time

    (tmp_path / "owner.json.tmp-killed").write_text("{}")
    killed = time.time() - 4  # ownerTimeout is 3
    os.utime(tmp_path / "owner.json.tmp-killed", (killed, killed))
    (tmp_path / "state.json.tmp-dead").write_text("{}")
    (tmp_path / ".m-3.tmp-dead").mkdir()
    (tmp_path / ".m-3.tmp-dead" / "part-00000.parquet").write_bytes(b"x")
    (tmp_path / "owner.json.tmp-waiting").write_text("{}")
    (tmp_path / "heartbeat-waiting.touch").write_text("")
    (tmp_path / "heartbeat-gone.touch").write_text("")
    old = time.time() - 3600
    os.utime(tmp_path / "heartbeat-gone.touch", (old, old))
    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None
    assert sorted(os.listdir(tmp_path)) == ["heartbeat-A.touch", "heartbeat-waiting.touch", "owner.json",
                                            "owner.json.tmp-waiting"]


def test_the_failure_listener_nacks_a_run_failing_right_after_its_first_trigger(tmp_path):
    """Review S4: the failed run's own "since" is set inside its first trigger, after that
    trigger's progress timestamp (its start). A run completing batch 1 and failing in the next
    trigger while its owner.json is still present had since > last progress, and its batches
    were not nacked. The listener now compares the trigger's end (timestamp + triggerExecution)."""
    import json
    import time

    from deltabus.policy.stream_ledger import Ledger
    from deltabus.spark.streaming import failed_batches, progress_end, progress_time

    assert progress_end("2026-11-27T03:05:45.250Z", {"triggerExecution": 1750}, 0.0) == 1795748747.0
    assert progress_end("2026-11-27T03:05:45.250Z", {}, 7.0) == 7.0  # no duration: the listener's clock
    assert progress_end("2026-11-27T03:05:45.250Z", {"triggerExecution": True}, 7.0) == 7.0
    assert progress_end(None, {"triggerExecution": 5}, 7.0) == 7.0
    directory = tmp_path / "_streams" / "uid" / "c"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(json.dumps(Ledger(next=3, batches={2: PENDING}).to_json()))
    trigger_start = time.time()
    time.sleep(0.02)
    run = _lock(directory, "failed")
    assert run.try_acquire() is None and run.since is not None and run.since > trigger_start  # inside trigger 1
    time.sleep(0.02)
    took_ms = int((time.time() - trigger_start) * 1000) + 1
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(trigger_start)) + f".{int(trigger_start % 1 * 1000):03d}Z"
    start = progress_time(stamp, 0.0)
    assert start <= trigger_start < run.since  # the start alone would skip the nack
    end = progress_end(stamp, {"triggerExecution": took_ms}, 0.0)
    assert end >= run.since
    assert failed_batches(str(directory), 1, end) == [2]  # its own owner.json still present: nacked
    assert failed_batches(str(directory), 1, start) == []  # what the start alone decided
    run.release()
    assert failed_batches(str(directory), 1, start) == [2]  # released: nobody owns it


def test_a_file_system_refusing_flock_fails_closed_naming_the_file(tmp_path):
    """Review S6a: an OSError from flock other than 'held' (ENOLCK, EOPNOTSUPP on FUSE or SMB)
    made the lock carry on without it. Now it is a FailedPrecondition naming the file. The
    refusal here is the kernel's own: flock on an O_PATH descriptor fails with EBADF."""
    import os
    import time

    from deltabus.errors import FailedPrecondition
    from deltabus.spark.streaming import LockBusy, _take_flock

    name = str(tmp_path / "owner.json.lock")
    open(name, "w").close()
    fd = os.open(name, os.O_PATH)
    try:
        with pytest.raises(FailedPrecondition, match=r"cannot flock .*owner\.json\.lock .*must support flock"):
            _take_flock(fd, name, time.time() + 1)
    finally:
        os.close(fd)
    held, other = os.open(name, os.O_RDWR), os.open(name, os.O_RDWR)
    try:
        _take_flock(held, name, time.time())
        with pytest.raises(LockBusy):  # held by another: still LockBusy after the deadline
            _take_flock(other, name, time.time() + 0.05)
    finally:
        os.close(held)
        os.close(other)


def test_the_owner_s_age_is_measured_on_the_file_system_s_clock(tmp_path):
    """Review S6b: staleness compared this host's time.time() with a heartbeat mtime a file
    server may have set. Now the age is the acquirer's own file's fresh mtime (_fs_now) less
    the heartbeat's: one clock. A file server an hour behind this host is played by mtimes an
    hour in the past with fs_now from the same (past) clock."""
    import json
    import os
    import time

    from deltabus.spark.streaming import _fs_now, _owner_gone, _owner_stale

    probe = tmp_path / "heartbeat-me.touch"
    probe.write_text("")
    past = time.time() - 3600
    os.utime(probe, (past, past))
    before = time.time()
    assert _fs_now(str(probe)) == os.path.getmtime(probe) >= before - 1  # touched: the clock's now
    owner = {"run": "X", "host": "another-host", "pid": 1, "beat": "heartbeat-X.touch"}
    (tmp_path / "owner.json").write_text(json.dumps(owner))
    beat = tmp_path / "heartbeat-X.touch"
    beat.write_text("")
    server_now = time.time() - 3600  # the server's clock, an hour behind this host's
    os.utime(beat, (server_now - 1, server_now - 1))
    path = str(tmp_path / "owner.json")
    assert not _owner_gone(path, owner, 10.0, server_now)  # beat 1 s ago by its own clock: alive
    assert _owner_gone(path, owner, 10.0, server_now + 12)  # 13 s: stale
    os.utime(beat, (time.time() + 1800, time.time() + 1800))  # a server half an hour ahead
    assert not _owner_gone(path, owner, 10.0, time.time() + 1800 + 2)
    os.remove(beat)  # heartbeat file gone: owner.json's own mtime, same clock
    os.utime(path, (server_now, server_now))
    assert not _owner_gone(path, owner, 10.0, server_now + 5) and _owner_gone(path, owner, 10.0, server_now + 11)
    (tmp_path / "owner.json").write_text("not json")  # unreadable doc: its mtime on the same clock
    os.utime(path, (server_now, server_now))
    assert not _owner_stale(path, None, 10.0, server_now + 5) and _owner_stale(path, None, 10.0, server_now + 11)
    os.remove(path)
    assert _owner_stale(path, None, 10.0, server_now)  # gone meanwhile: try again


def test_an_owner_json_that_cannot_be_read_now_is_neither_lost_nor_stale(tmp_path):
    """Review nit: every OSError reading owner.json counted as 'missing': a transient EIO or
    ESTALE set `lost` for good in still_owner, and made a live owner stale for an acquirer.
    Only a missing file or a doc that is not JSON count now; another OSError refuses the one
    write and is read again at the next check. The OSError here is a real one: owner.json a
    symlink to itself (ELOOP)."""
    import errno
    import os
    import time

    from deltabus.errors import FailedPrecondition
    from deltabus.spark.streaming import _read_owner, acquire_owner

    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None
    path = str(tmp_path / "owner.json")
    os.rename(path, path + ".aside")
    os.symlink("owner.json", path)  # open() fails with ELOOP
    with pytest.raises(OSError) as err:
        _read_owner(path)
    assert err.value.errno == errno.ELOOP
    assert not a.still_owner() and a.lost is None
    assert a.beat()  # the heartbeat goes on: the next beat reads again
    with pytest.raises(FailedPrecondition, match="could not read .*owner.json .*nothing was written"):
        with a.guard():
            pytest.fail("an unconfirmed owner must not write")
    old = time.time() - 60
    os.utime(a.beat_path, (old, old))
    doc = {"run": "B", "host": "h", "pid": 1, "since": time.time(), "beat": "heartbeat-B.touch"}
    assert acquire_owner(path, doc, 3.0) == {}  # held by someone unreadable: not stale, not removed
    assert os.path.islink(path)
    os.remove(path)
    os.rename(path + ".aside", path)
    os.utime(a.beat_path)
    assert a.still_owner() and a.lost is None and a.beat()
    with a.guard():
        pass
    os.remove(path)  # gone for real: lost for good
    assert not a.still_owner() and a.lost is not None and "removed" in a.lost and not a.beat()


def test_an_acquirer_whose_temporary_file_was_cleaned_meanwhile_just_ends_the_attempt(tmp_path):
    """The cleanup above may remove the owner.json.tmp-* of an acquirer that waited past
    ownerTimeout for the flock: its attempt ends with the holder's doc (and the next attempt
    writes a new file) instead of failing on the missing file."""
    import json
    import os
    import threading
    import time

    from deltabus.spark.streaming import _flocked, acquire_owner

    a = _lock(tmp_path, "A")
    assert a.try_acquire() is None
    old = time.time() - 60
    os.utime(a.beat_path, (old, old))  # A looks stale: the acquirer goes for the flock to remove it
    path = str(tmp_path / "owner.json")
    doc = {"run": "B", "host": "h", "pid": 1, "since": time.time(), "beat": "heartbeat-B.touch"}
    got: list[object] = []
    with _flocked(path, time.time() + 1):
        t = threading.Thread(target=lambda: got.append(acquire_owner(path, doc, 3.0)))
        t.start()
        deadline = time.time() + 5
        while not [n for n in os.listdir(tmp_path) if n.startswith("owner.json.tmp-")] and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # waiting for the flock now
        for n in os.listdir(tmp_path):
            if n.startswith("owner.json.tmp-"):
                os.remove(tmp_path / n)  # as a new owner's cleanup would
    t.join(10)
    assert got and got[0] is not None and got[0]["run"] == "A"  # the attempt ended: A's doc, no error
    assert json.loads(open(path).read())["run"] == "A"
    assert not [n for n in os.listdir(tmp_path) if n.startswith("owner.json.tmp-")]
