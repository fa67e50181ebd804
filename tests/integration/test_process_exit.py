"""Short-lived processes that read tables must exit cleanly.

delta-rs's default pyarrow filesystem handler is implemented in Python; with Arrow's I/O
threads still holding it at interpreter exit, about half of such processes aborted
("terminate called without an active exception"). Reads now use Arrow's native filesystem.
"""

import subprocess
import sys

from deltabus import SubscriberClient
from tests import background
from tests.background import in_warehouse

SCRIPT = """
import sys
from deltabus import PublisherClient, SubscriberClient
from deltabus.storage.arrow import read_table
wh = sys.argv[1]
sub = SubscriberClient(warehouse=wh)
sub.list_subscriptions(project="local")
sub.pull(subscription="projects/local/subscriptions/orders-pull", max_messages=5, return_immediately=True)
read_table(wh + "/messages")
"""


def reading_processes_exit_cleanly(pub, topic, warehouse, _tmp):
    sub = SubscriberClient(warehouse=warehouse)
    sub.create_subscription(name=sub.subscription_path("local", "orders-pull"), topic=topic, ack_deadline_seconds=10)
    sub.close()
    pub.publish_batch(topic, [{"data": b"x"}] * 20)
    codes = [subprocess.run([sys.executable, "-c", SCRIPT, warehouse], capture_output=True, timeout=60, env=background.env()).returncode
             for _ in range(12)]
    assert codes == [0] * 12


# Twelve interpreters (~10 s): in the background from the session's first test on (tests/background.py).
BACKGROUND = {"test_reading_processes_exit_cleanly": in_warehouse(reading_processes_exit_cleanly)}


def test_reading_processes_exit_cleanly(early_background):
    early_background.result("test_reading_processes_exit_cleanly")
