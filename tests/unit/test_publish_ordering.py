"""The publisher's ordering-key pause (issue 13, as Pub/Sub's publisher client): a failed
batch pauses its keys; their later messages fail without being committed until resumed."""

from __future__ import annotations

import threading
from typing import Sequence

import pytest

from deltabus.errors import OrderingKeyPaused
from deltabus.publisher.batcher import Batcher
from deltabus.publisher.rows import OutgoingMessage
from deltabus.types import BatchSettings


def msg(data: str, key: str = "") -> OutgoingMessage:
    return OutgoingMessage(data.encode(), {}, key, len(data))


def test_a_failed_batch_pauses_its_keys_until_resumed() -> None:
    release = threading.Event()
    committed: list[list[str]] = []

    def commit(topic: str, messages: Sequence[OutgoingMessage]) -> Sequence[str]:
        datas = [m.data.decode() for m in messages]
        if not committed and datas[0] == "a1":
            release.wait(10)
            committed.append([])
            raise OSError("storage unreachable")
        committed.append(datas)
        return [f"id-{d}" for d in datas]

    b = Batcher(commit, BatchSettings(max_messages=2, max_latency=5.0))
    try:
        # Batches go only when full (2 messages): the first is sent and held in commit.
        first = [b.submit("t", msg("a1", "a")), b.submit("t", msg("b1", "b"))]
        queued = [b.submit("t", msg("a2", "a")), b.submit("t", msg("n1"))]  # waits behind it
        release.set()
        for f in first:
            with pytest.raises(OSError):
                f.result(5)
        # a2 was queued before the failure: it fails too, uncommitted; the keyless n1 goes through
        with pytest.raises(OrderingKeyPaused) as paused:
            queued[0].result(5)
        assert (paused.value.topic, paused.value.ordering_key) == ("t", "a")
        assert queued[1].result(5) == "id-n1"
        # new publishes with a paused key fail at once; other topics and keys are free
        with pytest.raises(OrderingKeyPaused):
            b.submit("t", msg("b2", "b")).result(0)
        # (each pair fills a batch, which is then sent at once)
        assert [f.result(5) for f in (b.submit("other", msg("a9", "a")), b.submit("other", msg("n2")))] == ["id-a9", "id-n2"]
        b.resume("t", "b")
        assert [f.result(5) for f in (b.submit("t", msg("b3", "b")), b.submit("t", msg("n3")))] == ["id-b3", "id-n3"]
        with pytest.raises(OrderingKeyPaused):
            b.submit("t", msg("a3", "a")).result(0)
    finally:
        b.flush_and_stop()
    assert ["a2"] not in committed and all("a2" not in c and "b2" not in c for c in committed)
