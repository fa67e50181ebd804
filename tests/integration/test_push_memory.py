"""The push job's byte cap (Settings.max_queued_bytes): large messages never pile up in the
driver or its workers beyond it. Real Delta tables, a real aiohttp endpoint, local Spark."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from deltabus import config
from deltabus._server_thread import ServerThread
from deltabus.push import runner
from deltabus.validation import MAX_DATA_BYTES

pytestmark = pytest.mark.spark

MESSAGES = 12
CAP = 25_000_000  # two 10 MB messages fit, a third does not


class CountingEndpoint:
    """Keeps the ids pushed and the most requests it held at once (not the bodies)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.ids: list[str] = []
        self.open = 0
        self.most_open = 0
        self._lock = threading.Lock()
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        self._server = ServerThread(app, name="test-memory-endpoint")

    async def _handle(self, request: web.Request) -> web.Response:
        with self._lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        try:
            mid = json.loads(await request.read())["message"]["messageId"]
            await asyncio.sleep(self.delay)
            with self._lock:
                self.ids.append(mid)
            return web.Response(status=204)
        finally:
            with self._lock:
                self.open -= 1

    def __enter__(self) -> "CountingEndpoint":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.port}/push"


def test_ten_megabyte_messages_stay_within_the_byte_cap(spark, pub, psub, topic, warehouse):
    """12 messages of 10 MB with a 25 MB cap: at most two are ever leased and unsettled at
    once (the endpoint never holds a third), and every one is pushed and acked. Without the
    cap the push window (3 at first, doubling) holds more at once."""
    with CountingEndpoint(delay=0.3) as ep:
        s = psub.subscription_path("local", "big")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        ids = [pub.publish(topic, bytes([i]) * MAX_DATA_BYTES).result() for i in range(MESSAGES)]
        settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.2, backlog_interval=0.5,
                                   engine="delta-rs", max_queued_bytes=CAP)
        summary = runner.run(spark, settings, until_idle=True, max_seconds=240)
        assert sorted(ep.ids) == sorted(ids) and summary.acked == MESSAGES
        assert ep.most_open <= 2
        assert 2 * MAX_DATA_BYTES <= summary.peak_push_bytes <= CAP
    assert psub.get_backlog(s).num_unacked_messages == 0


def test_a_message_larger_than_the_cap_still_goes_alone(spark, pub, psub, topic, warehouse):
    with CountingEndpoint(delay=0.0) as ep:
        s = psub.subscription_path("local", "bigger")
        psub.create_subscription(name=s, topic=topic, push_config={"push_endpoint": ep.url})
        ids = [pub.publish(topic, b"z" * 3_000_000).result() for _ in range(3)]
        settings = config.Settings(warehouse=warehouse, allow_http=True, trigger_interval=0.2, backlog_interval=0.5,
                                   engine="delta-rs", max_queued_bytes=1_000_000)
        summary = runner.run(spark, settings, until_idle=True, max_seconds=120)
        assert sorted(ep.ids) == sorted(ids) and ep.most_open == 1
        assert summary.peak_push_bytes == 3_000_000
