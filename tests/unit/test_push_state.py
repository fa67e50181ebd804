"""Per-subscription push state: outcome reasons, backoff transitions and their log lines."""

import asyncio
import datetime as dt
import socket

from deltabus.push.sender import send_all


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def test_a_refused_connection_is_reported_as_such():
    row = dict(sub_uid="s1", subscription="projects/p/subscriptions/s", message_id="1", delivery_attempt=1,
               endpoint=f"http://127.0.0.1:{closed_port()}/push?token=secret", token=None, no_wrapper=False,
               write_metadata=False, timeout_seconds=5.0, data=b"x", attributes=[], ordering_key="",
               publish_time=dt.datetime.now(dt.timezone.utc))
    [(status, outcome, _, error)] = asyncio.run(send_all([row]))
    assert (status, outcome, error) == (0, "error", "connection refused")
