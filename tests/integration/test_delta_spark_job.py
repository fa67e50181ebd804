"""The push job on delta-spark: its stream is Delta's own change feed, and it restarts from
its checkpoint (nothing delivered twice, nothing lost)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from deltabus import config
from deltabus.push import runner
from tests.conftest import requires_delta
from tests.endpoints import Endpoint

# The cluster-engine group (./run-tests.sh -m cluster): minutes of delta-spark micro-batches here.
pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def _settings(warehouse: str) -> config.Settings:
    return config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.2, backlog_interval=0.5, engine="delta-spark")


def _offset_logs(checkpoint: Path) -> list[Path]:
    """The offset logs (files named by batch id; Spark's checksum files, ``.N.crc``, left out)."""
    if not (checkpoint / "offsets").is_dir():
        return []
    return sorted((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def test_delta_spark_stream_reads_the_change_feed_and_restarts_from_its_checkpoint(spark, pub, psub, topic, warehouse):
    requires_delta(spark)
    checkpoint = Path(warehouse) / "_checkpoints" / "deliver-delta-spark"
    with Endpoint() as ep:
        s = psub.subscription_path("local", "restarted")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        # Published while the job runs: the stream starts at the table's latest version, so
        # only a commit after the start gives its Delta source an offset to record.
        stop = threading.Event()
        runs: list[runner.RunSummary | BaseException] = []

        def run_job() -> None:
            try:
                runs.append(runner.run(spark, _settings(warehouse), stop=stop, max_seconds=120))
            except BaseException as exc:  # seen by the test, not lost in the thread
                runs.append(exc)

        job = threading.Thread(target=run_job)
        job.start()
        try:
            started = time.time() + 90
            while time.time() < started and not _offset_logs(checkpoint) and job.is_alive():
                time.sleep(0.2)
            assert _offset_logs(checkpoint), f"the job wrote no offset log within 90 s: {runs}"
            first = pub.publish_batch(topic, [{"data": f"a{i}".encode()} for i in range(30)])
            pushed = time.time() + 90
            while time.time() < pushed and len({json.loads(r.body)["message"]["messageId"] for r in ep.snapshot()}) < 30:
                time.sleep(0.2)
        finally:
            stop.set()
            job.join(120)
        assert not job.is_alive() and len(runs) == 1 and isinstance(runs[0], runner.RunSummary), runs
        one = runs[0]
        logs = _offset_logs(checkpoint)
        assert logs, "the delta-spark job keeps its own checkpoint"
        # Its stream source is Delta's (readStream.format("delta") with the change feed):
        # Delta's offsets name the table and its version.
        delta_offsets = [
            json.loads(line) for log in logs for line in log.read_text().splitlines() if "reservoirVersion" in line
        ]
        assert delta_offsets and all("reservoirId" in o for o in delta_offsets)
        last_batch = int(logs[-1].name)

        second = pub.publish_batch(topic, [{"data": f"b{i}".encode()} for i in range(30)])  # while no job runs
        two = runner.run(spark, _settings(warehouse), until_idle=True, max_seconds=120)
        assert two.stopped_because == "nothing left to deliver or retry"
        # The same query carried on: its batch ids continue after the first run's.
        assert int(_offset_logs(checkpoint)[0].name) <= last_batch < int(_offset_logs(checkpoint)[-1].name)

        pushed = Counter(json.loads(r.body)["message"]["messageId"] for r in ep.snapshot())
        assert set(pushed) == set(first) | set(second)  # nothing lost
        assert max(pushed.values()) == 1  # nothing pushed again by the restart
        assert one.delivered == one.acked == 30 and two.delivered == two.acked == 30
        assert psub.get_backlog(s).num_unacked_messages == 0
