"""Fixtures for `deltabus serve` tests: a real server in this process on a free 127.0.0.1
port against a temp warehouse, and the REAL google-cloud-pubsub clients pointed at it
through PUBSUB_EMULATOR_HOST (set with monkeypatch, so it ends with the test).

Use: ``from tests.server_fixtures import serve_thread, gpub, gsub  # noqa: F401``.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from deltabus.server.app import ServerThread
from deltabus.server.settings import ServeSettings

PROJECT = "proj"


@pytest.fixture
def serve_thread(warehouse: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    """A started server (allow_http: the push tests' endpoints are plain http on 127.0.0.1)."""
    server = ServerThread(ServeSettings(warehouse=warehouse, port=0, allow_http=True, grace_seconds=1.0)).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{server.port}")
    yield server
    server.stop()


@pytest.fixture
def gpub(serve_thread: ServerThread) -> Iterator[object]:
    from google.cloud import pubsub_v1

    client = pubsub_v1.PublisherClient()
    yield client
    client.stop()


@pytest.fixture
def gsub(serve_thread: ServerThread) -> Iterator[object]:
    from google.cloud import pubsub_v1

    client = pubsub_v1.SubscriberClient()
    yield client
    client.close()
