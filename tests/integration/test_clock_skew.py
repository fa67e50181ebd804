"""Clock skew (issue 16, scenario 4): pullers whose clocks are ±30 s off share one subscription.

The main proof runs ``bench/chaos_skew.run`` small: three pullers in threads, their wall
clocks injected 30 s ahead, 30 s behind and exact, each acking at once but abandoning the
first delivery of one message in ten, on a real warehouse. Its figures are the pullers' own
records in true time (see bench/chaos_skew.py). With the storage clock (storage/clock.py):
no lease taken while it still ran in true time, no acked message delivered again, no
duplicate, nothing lost. A deterministic control shows a puller 30 s ahead taking every
running lease of one 30 s behind without the correction, and none with it. One more run is a real process under
libfaketime (+30 s), when the machine has it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import chaos_skew
from deltabus import PublisherClient, SubscriberClient
from deltabus.errors import ClockUncertain
from deltabus.policy.clock_skew import ClockSkewPolicy
from deltabus.storage import open_engine
from deltabus.storage.clock import StorageClock, deadline
from tests.conftest import table_versions

ROOT = Path(__file__).resolve().parents[2]
SKEW = 30.0


def test_pullers_30_s_apart_never_take_a_running_lease_nor_lose_a_message(tmp_path: Path) -> None:
    out = chaos_skew.run(tmp_path, messages=300, skew_seconds=SKEW)
    assert out["errors"] == 0, out["error_samples"]
    assert out["leases_granted_twice"] == 0, out["violations"]
    assert out["acked_redelivered"] == 0 and out["stale_acks"] == 0
    assert out["duplicates"] == 0
    assert out["lost"] == 0 and out["never_delivered"] == 0
    # Leases did run out (the abandoned ones) and were taken again: expiry was judged across clocks.
    assert out["deliveries"] > out["messages"]
    for name, skew in [("ahead", SKEW), ("behind", -SKEW), ("exact", 0.0)]:
        est = out["offsets"][name]
        assert est["available"] and est["low"] <= -skew <= est["high"], (name, est)
        assert est["width"] < 0.2, est
    assert 0 < out["bound"]["widest_lease_pad"] < 0.2


@pytest.mark.parametrize("correct", [False, True])
def test_a_puller_ahead_takes_a_running_lease_only_without_the_correction(tmp_path: Path, correct: bool) -> None:
    """The control, deterministic: a puller 30 s behind leases every message for 10 s; one 30 s
    ahead pulls at once. Without the correction it sees those leases as long expired and takes
    them all while they still run (in true time); with it, none. (A random control run, 4 s of
    chaos_skew without the correction, found no steal once on a loaded CI machine.)"""
    wh = str(tmp_path / "wh")
    pub = PublisherClient(warehouse=wh)
    topic = pub.topic_path("local", "skew-control")
    pub.create_topic(name=topic)
    extra = {"clock_skew": ClockSkewPolicy()} if correct else {}
    behind = SubscriberClient(warehouse=wh, clock=lambda: time.time() - SKEW, **extra)
    ahead = SubscriberClient(warehouse=wh, clock=lambda: time.time() + SKEW, **extra)
    name = behind.subscription_path("local", "skew-control")
    behind.create_subscription(name=name, topic=topic, ack_deadline_seconds=10)
    pub.publish_batch(topic, [{"data": b"m"}] * 20)
    held = behind.pull(subscription=name, max_messages=100).received_messages
    t_leased = time.time()
    taken = ahead.pull(subscription=name, max_messages=100, return_immediately=True).received_messages
    assert time.time() - t_leased < 10.0  # still inside the leases' 10 s, in true time
    assert len(held) == 20
    assert len(taken) == (0 if correct else 20)


def test_a_storage_clock_reads_storage_time_from_commits_and_probes(warehouse: str) -> None:
    PublisherClient(warehouse=warehouse).create_topic(name="projects/local/topics/clocks")
    engine = open_engine(warehouse, engine="delta-rs")
    clock = StorageClock(lambda: time.time() + SKEW)
    assert clock() == pytest.approx(time.time() + SKEW, abs=0.5)  # not attached: the local clock
    clock.attach(engine)
    t0 = time.time()
    earliest, latest = clock(), clock.latest()
    t1 = time.time()
    assert t0 - 0.05 <= earliest <= latest <= t1 + 0.05
    assert clock.probes == 1
    before = clock.describe()["observations"]
    PublisherClient(engine=engine, clock=clock).publish_batch("projects/local/topics/clocks", [{"data": b"x"}])
    assert clock.describe()["observations"] == before + 1 and clock.probes == 1  # the commit, no probe
    assert deadline(clock, earliest, 10.0) >= t1 + 10.0 - 0.05
    assert deadline(time.time, 5.0, 10.0) == 15.0  # a plain clock: now + seconds


def test_a_warehouse_without_storage_stamps_keeps_the_local_clock() -> None:
    class ObjectStore:
        warehouse = "s3://bucket/warehouse"

        def observe_commits(self, observer: object) -> None:
            pass

    clock = StorageClock(lambda: 1_000.0)
    clock.attach(ObjectStore())  # type: ignore[arg-type]
    assert clock() == 1_000.0 and clock.latest() == 1_000.0
    assert "not on a file system" in clock.describe()["reason"]


def test_a_clock_known_too_loosely_refuses_to_lease_and_writes_nothing(warehouse: str, pub, topic: str) -> None:
    sub = SubscriberClient(warehouse=warehouse, clock_skew=ClockSkewPolicy(max_uncertainty=1e-6))
    name = sub.subscription_path("local", "loose")
    sub.create_subscription(name=name, topic=topic)
    pub.publish_batch(topic, [{"data": b"x"}])
    versions = table_versions(warehouse)
    with pytest.raises(ClockUncertain, match=r"max_uncertainty"):
        sub.pull(subscription=name, max_messages=1, return_immediately=True)
    assert table_versions(warehouse) == versions
    sub.close()


def test_clients_and_the_server_keep_storage_time_unless_given_a_clock(warehouse: str, pub) -> None:
    from deltabus.server.app import ServerThread
    from deltabus.server.settings import ServeSettings

    assert isinstance(pub._clock, StorageClock)  # no clock given: the storage's time
    given = SubscriberClient(warehouse=warehouse, clock=time.time)
    assert given._clock is time.time  # a given clock is used as it is
    corrected = SubscriberClient(warehouse=warehouse, clock=time.time, clock_skew=ClockSkewPolicy())
    assert isinstance(corrected._clock, StorageClock)  # unless a policy asks for the correction
    off = SubscriberClient(warehouse=warehouse, clock_skew=ClockSkewPolicy(correct=False))
    assert off._clock is time.time
    server = ServerThread(ServeSettings(warehouse=warehouse, port=0, grace_seconds=1.0)).start()
    try:
        state = server.state
        assert isinstance(state.clock, StorageClock)
        assert state.subscriber._clock is state.clock and state.publisher._clock is state.clock  # one clock
    finally:
        server.stop()
    for c in (given, corrected, off):
        c.close()


@pytest.mark.skipif(shutil.which("faketime") is None, reason="libfaketime is not installed (apt-get install faketime)")
def test_a_process_under_faketime_30_s_ahead_does_not_take_a_running_lease(warehouse: str, pub, topic: str) -> None:
    sub = SubscriberClient(warehouse=warehouse)
    name = sub.subscription_path("local", "faked")
    sub.create_subscription(name=name, topic=topic, ack_deadline_seconds=60)
    pub.publish_batch(topic, [{"data": b"held"}])
    held = sub.pull(subscription=name, max_messages=1, return_immediately=True).received_messages
    assert len(held) == 1  # leased for 60 s here, never acked
    script = textwrap.dedent(f"""
        import json, time
        from deltabus import SubscriberClient
        from deltabus.policy.clock_skew import ClockSkewPolicy
        corrected = SubscriberClient(warehouse={warehouse!r})
        got = corrected.pull(subscription={name!r}, max_messages=1, return_immediately=True).received_messages
        raw = SubscriberClient(warehouse={warehouse!r}, clock_skew=ClockSkewPolicy(correct=False))
        stole = raw.pull(subscription={name!r}, max_messages=1, return_immediately=True).received_messages
        print(json.dumps({{"corrected": len(got), "uncorrected": len(stole), "clock": corrected._clock.describe(),
                           "skew": time.time() - {time.time()!r}}}))
    """)
    # 90 s ahead: past the 60 s lease on this process's clock, far inside it in true time.
    env = {**os.environ, "FAKETIME_DONT_RESET": "1"}
    proc = subprocess.run(["faketime", "-f", "+90s", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["skew"] > 85, out  # the child's clock really was ahead
    assert out["corrected"] == 0, out  # storage time: the lease still runs
    assert out["uncorrected"] == 1, out  # its own clock: taken while running (the behaviour before the bound)
    assert out["clock"]["low"] - 0.1 <= -90.0 <= out["clock"]["high"] + 0.1, out  # its offset to the storage
    sub.close()
