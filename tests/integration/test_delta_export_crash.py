"""A Delta export subscription's exactly-once append (issue 17), with the job SIGKILLed at random
and chosen points: before an append, between append and ack, inside the append (delta-rs's
write and commit), and at random times. After each kill the job is started again; in the end
every message id is in the target table exactly once and the subscription has no backlog.
Workers: _export_worker.py (the job's own ``process`` on delta-rs, in a child process)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from deltalake import DeltaTable

import deltabus
from tests.integration import _export_worker as worker

OUT_OF_PROCESS = True

WORKER = Path(worker.__file__)


def run(warehouse: str, subscription: str, kill_at: str, seed: int) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(deltabus.__file__).parents[1]), str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(WORKER), warehouse, subscription, kill_at, str(seed)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr[-3000:]
    return done.returncode


def test_sigkill_at_any_point_leaves_every_message_in_the_table_exactly_once(pub, sub, topic, warehouse, tmp_path):
    table = str(tmp_path / "landed")
    s = sub.subscription_path("local", "export-crashy")
    sub.create_subscription(request={"name": s, "topic": topic, "delta_config": {"table": table, "write_metadata": True}})
    ids = []
    for start in range(0, 1500, 500):
        ids += pub.publish_batch(topic, [{"data": f"m{i}".encode()} for i in range(start, start + 500)])
    rng = random.Random(17)
    plan = ["after-append:2", "before-append:2", f"mid-append:{rng.randint(1, 4)}", "after-append:1",
            f"mid-append:{rng.randint(1, 4)}", f"random:{rng.uniform(0.5, 2.0):.2f}", f"random:{rng.uniform(0.5, 2.0):.2f}"]
    killed = 0
    for i, kill_at in enumerate(plan):
        if run(warehouse, s, kill_at, seed=i) == -signal.SIGKILL:
            killed += 1
    assert killed >= 5  # the chosen points always kill; a random one may come after the end
    assert run(warehouse, s, "none", seed=99) == 0  # and a clean run finishes the rest
    landed = Counter(DeltaTable(table).to_pyarrow_table()["message_id"].to_pylist())
    assert set(landed) == set(ids)  # none lost
    assert [m for m, n in landed.items() if n > 1] == []  # none twice
    assert sub.get_backlog(s).num_unacked_messages == 0
