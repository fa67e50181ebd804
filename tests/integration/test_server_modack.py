"""`deltabus serve`: a deadline change that ends a stream's leases no later than their
committed end (the Python client's receipt modack) is answered before its round commits,
and commits with the next round; one that extends a lease waits for its commit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from deltalake import DeltaTable

from deltabus import ackid
from deltabus.policy.stream_flow import StreamFlow
from deltabus.server import streaming
from deltabus.server.app import ServerThread
from tests.conftest import delivery_state
from tests.server_fixtures import PROJECT, gpub, gsub, serve_thread  # noqa: F401

T = f"projects/{PROJECT}/topics/modack-topic"
S = f"projects/{PROJECT}/subscriptions/modack-sub"


def lease_ends(warehouse: str) -> dict[str, int]:
    t = delivery_state(DeltaTable(f"{warehouse}/deliveries").to_pyarrow_table(columns=["sub_uid", "message_id", "lease_expires"]))
    return {m: v.timestamp() * 1e6 if v is not None else None for m, v in zip(t["message_id"].to_pylist(), t["lease_expires"].to_pylist())}


def versions(warehouse: str) -> int:
    return DeltaTable(f"{warehouse}/deliveries").version()


def on_loop(server: ServerThread, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, server._loop).result(timeout=30)


def test_receipt_modack_answers_before_its_round_and_still_commits(serve_thread, gpub, gsub, warehouse: str) -> None:
    gpub.create_topic(name=T)
    gsub.create_subscription(name=S, topic=T)
    gpub.publish(T, b"x").result(timeout=30)
    state = serve_thread.state

    async def lease() -> tuple[Any, list[ackid.AckId], float]:
        hub = streaming.hub_for(state)
        rec = state.registry.subscription(S)
        s = streaming._Stream(S, rec.sub_uid, rec.topic_uid, T, False, 60.0, StreamFlow(max_messages=10, max_bytes=0))
        hub.add(s)
        granted = await hub.commits.lease(S, 10, 60.0)
        for m in granted.messages:
            s.flow.leased(m.ack_id, m.message.size, granted.lease_end)
            hub.own(s, m.ack_id, granted.lease_end)
        return s, [ackid.decode(m.ack_id) for m in granted.messages], granted.lease_end

    s, ids, end = on_loop(serve_thread, lease())
    assert len(ids) == 1
    before = versions(warehouse)

    async def receipt() -> int:
        hub = streaming.hub_for(state)
        await hub.modify_deadline(S, ids, 10)  # shortens the 60 s lease: answered at once ...
        return versions(warehouse)  # ... before its round could run (it runs on the loop's next turns)

    assert on_loop(serve_thread, receipt()) == before
    give_up = time.monotonic() + 20
    while versions(warehouse) == before and time.monotonic() < give_up:
        time.sleep(0.02)
    assert versions(warehouse) == before + 1  # ... and committed with its round
    shortened = lease_ends(warehouse)[ids[0].message_id]
    assert shortened < end * 1e6 - 40e6  # about now + 10 s, not the lease's 60 s

    async def extend() -> int:
        await streaming.hub_for(state).modify_deadline(S, ids, 120)  # past the committed end: waits for it
        return versions(warehouse)

    assert on_loop(serve_thread, extend()) == before + 2
    assert lease_ends(warehouse)[ids[0].message_id] > end * 1e6
    on_loop(serve_thread, _remove(state, s))


async def _remove(state: Any, s: Any) -> None:
    streaming.hub_for(state).remove(s)
