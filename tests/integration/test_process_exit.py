"""Short-lived processes that read tables must exit cleanly.

delta-rs's default pyarrow filesystem handler is implemented in Python; with Arrow's I/O
threads still holding it at interpreter exit, about half of such processes aborted
("terminate called without an active exception"). Reads now use Arrow's native filesystem.
"""

import subprocess
import sys

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


def test_reading_processes_exit_cleanly(pub, sub, topic, subscription, warehouse):
    pub.publish_batch(topic, [{"data": b"x"}] * 20)
    codes = [subprocess.run([sys.executable, "-c", SCRIPT, warehouse], capture_output=True, timeout=60).returncode for _ in range(12)]
    assert codes == [0] * 12
