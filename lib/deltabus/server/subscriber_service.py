"""The ``google.pubsub.v1.Subscriber`` service of `deltabus serve` (StreamingPull is in
``streaming``).

Administration and acks go through the deltabus SubscriberClient's own methods (request
dicts from ``convert``), so validation, update-mask rules (``filter`` and
``enable_message_ordering`` fixed at creation; a masked field left unset clears a policy)
and the dead-letter checks are the library's. All blocking work runs on the server's pool.

Pull leases with the subscription's ack deadline through the group commit
(``group_commit.GroupCommits``: one MERGE per round with the streams' leases and every
caller's acks). Without ``return_immediately`` it waits for a message up to
PULL_WAIT seconds (less when the call's deadline is nearer): it re-reads after a commit to
the messages or deliveries table (a stat of their logs every WAIT_STEP) or every
IDLE_RECHECK (lease expiries make no commit), and answers an empty response at the end.
max_messages above MAX_PULL are capped, as Pub/Sub caps them. A response stays under the
client's 4 MiB limit: leased messages beyond it are given back at once (a nack, which counts
as a delivery attempt and follows the retry policy).

Exactly-once delivery (issue 15): on a subscription with ``enable_exactly_once_delivery``
Acknowledge and ModifyAckDeadline answer per ack id. They apply every id that names a
current delivery; when any did not, the call fails with INVALID_ARGUMENT whose rich status
(``status.status_of`` of an ``AcknowledgeError``) maps each failed id, exactly as the
request spelled it, to ``PERMANENT_FAILURE_INVALID_ACK_ID``; ids it does not name applied.
The group commit's round learns from the record it reads anyway whether the subscription is
exactly-once, so neither call reads anything more on other subscriptions (best effort, as
before: an id that does not apply is silently ignored).

Seek and snapshots (issue 15) are the SubscriberClient's ``seek`` and ``*_snapshot``
methods (``delivery/seek``, ``snapshots``), with requests from ``convert``: a Seek names a
``time`` or a ``snapshot`` (neither: INVALID_ARGUMENT naming ``target``; a snapshot of
another topic: INVALID_ARGUMENT naming ``snapshot``); UpdateSnapshot changes ``labels``
only. A Seek ends every lease of the subscription in the table (its ack ids no longer
apply), so once it has committed the server's streams of that subscription forget what
they held and ask again at once (``StreamHub.sought``): the replayed messages are
delivered without waiting for an idle recheck or for the client to settle dead ack ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as pb

from ..delivery.model import IdResult, Result
from ..errors import AcknowledgeError, AcknowledgeStatus, FailedPrecondition, InvalidArgument, NotFound
from .. import ackid, names
from ..storage.tables import BACKLOG
from ..types import MAX_ACK_DEADLINE
from . import convert, streaming
from .calls import rpc
from .publisher_service import page_request
from .state import LeasedMessage, ServerState, split_for_response

Context = grpc.aio.ServicerContext[Any, Any]
PULL_WAIT = 10.0  # seconds a waiting Pull holds at most before answering empty
IDLE_RECHECK = 0.5  # seconds between reads while nothing commits
WAIT_STEP = 0.02  # seconds between stats of the logs while waiting
DEADLINE_MARGIN = 0.5  # seconds before the call's deadline a waiting Pull answers
MAX_PULL = 1000


def _ack_ids(subscription: str, ack_ids: Any) -> tuple[str, list[ackid.AckId]]:
    """The subscription's name and the decoded ack ids (InvalidArgument naming the field)."""
    name = str(names.parse_subscription(subscription))
    if not ack_ids:
        raise InvalidArgument("ack_ids", "at least one ack id is required")
    return name, streaming.decode_ids(list(ack_ids), "ack_ids")


def _refuse_failed(ack_ids: Any, results: list[IdResult] | None) -> None:
    """AcknowledgeError mapping each ack id (as the request spelled it) whose outcome did not
    apply to INVALID_ACK_ID; nothing when all applied or there are no results (not exactly-once)."""
    if results is None:
        return
    failed = {a: AcknowledgeStatus.INVALID_ACK_ID for a, r in zip(list(ack_ids), results) if r.result is not Result.SUCCESS}
    if failed:
        raise AcknowledgeError(AcknowledgeStatus.INVALID_ACK_ID, f"{len(failed)} of {len(results)} ack ids name no current delivery",
                               failed)


def received(m: LeasedMessage) -> pb.ReceivedMessage:
    return convert.received_to_proto(
        m.ack_id, m.data, m.attributes, m.message_id, m.publish_time, m.ordering_key, m.delivery_attempt
    )


class SubscriberService:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    # -- administration ------------------------------------------------------------------
    @rpc
    async def CreateSubscription(self, request: pb.Subscription, context: Context) -> pb.Subscription:
        try:
            body = convert.subscription_values(request)
            sub = await self.state.run(self.state.subscriber.create_subscription, request=body)
        except InvalidArgument as exc:  # delta_config is bigquery_config on the wire
            raise convert.api_field_names(exc) from None
        return convert.subscription_to_proto(sub)

    def _export_statuses(self, subs: Any) -> dict[str, str | None]:
        """The push job's latest outcome (backlog.last_status) of each Delta export among `subs`,
        by name, for BigQueryConfig.state; a read of the backlog table only when there is one."""
        wanted = {s.name for s in subs if s.delta_config is not None}
        if not wanted:
            return {}
        rows = self.state.subscriber.engine.snapshot(BACKLOG.name).read(columns=["subscription", "last_status"]).to_pylist()
        return {r["subscription"]: r["last_status"] for r in rows if r["subscription"] in wanted}

    @rpc
    async def GetSubscription(self, request: pb.GetSubscriptionRequest, context: Context) -> pb.Subscription:
        def get() -> tuple[Any, dict[str, str | None]]:
            sub = self.state.subscriber.get_subscription(request={"subscription": request.subscription})
            return sub, self._export_statuses([sub])

        sub, statuses = await self.state.run(get)
        return convert.subscription_to_proto(sub, statuses.get(sub.name))

    @rpc
    async def UpdateSubscription(self, request: pb.UpdateSubscriptionRequest, context: Context) -> pb.Subscription:
        paths = convert.mask_paths(request.update_mask if "update_mask" in request else None)
        try:
            values = convert.subscription_values(request.subscription, paths)
            values["name"] = request.subscription.name
            body = {"subscription": values, "update_mask": convert.update_paths(paths)}
            sub = await self.state.run(self.state.subscriber.update_subscription, request=body)
        except InvalidArgument as exc:  # delta_config is bigquery_config on the wire
            raise convert.api_field_names(exc) from None
        return convert.subscription_to_proto(sub)

    @rpc
    async def ListSubscriptions(self, request: pb.ListSubscriptionsRequest, context: Context) -> pb.ListSubscriptionsResponse:
        body = page_request(("project", request.project), request.page_size, request.page_token)

        def first_page() -> tuple[Any, dict[str, str | None]]:
            page = next(iter(self.state.subscriber.list_subscriptions(request=body).pages))
            return page, self._export_statuses(page.subscriptions)

        page, statuses = await self.state.run(first_page)
        return pb.ListSubscriptionsResponse(
            subscriptions=[convert.subscription_to_proto(s, statuses.get(s.name)) for s in page.subscriptions],
            next_page_token=page.next_page_token,
        )

    @rpc
    async def DeleteSubscription(self, request: pb.DeleteSubscriptionRequest, context: Context) -> empty_pb2.Empty:
        await self.state.run(self.state.subscriber.delete_subscription, request={"subscription": request.subscription})
        return empty_pb2.Empty()

    @rpc
    async def ModifyPushConfig(self, request: pb.ModifyPushConfigRequest, context: Context) -> empty_pb2.Empty:
        push = convert.push_config_request(request.push_config) if "push_config" in request else {}
        body = {"subscription": request.subscription, "push_config": push}
        await self.state.run(self.state.subscriber.modify_push_config, request=body)
        return empty_pb2.Empty()

    # -- delivery --------------------------------------------------------------------------
    @rpc
    async def Acknowledge(self, request: pb.AcknowledgeRequest, context: Context) -> empty_pb2.Empty:
        # Through the group commit (streaming.StreamHub), so the acked messages stop counting
        # against their StreamingPull's flow control and share a MERGE with other callers.
        # Exactly-once: a result per id (the module docstring).
        name, ids = _ack_ids(request.subscription, request.ack_ids)
        _refuse_failed(request.ack_ids, await streaming.hub_for(self.state).acknowledge(name, ids, results=True))
        return empty_pb2.Empty()

    @rpc
    async def ModifyAckDeadline(self, request: pb.ModifyAckDeadlineRequest, context: Context) -> empty_pb2.Empty:
        seconds = request.ack_deadline_seconds
        if not 0 <= seconds <= MAX_ACK_DEADLINE:
            raise InvalidArgument("ack_deadline_seconds", f"must be an integer 0..{MAX_ACK_DEADLINE}, got {seconds}")
        name, ids = _ack_ids(request.subscription, request.ack_ids)
        _refuse_failed(request.ack_ids, await streaming.hub_for(self.state).modify_deadline(name, ids, seconds, results=True))
        return empty_pb2.Empty()

    async def _lease(self, subscription: str, n: int) -> list[LeasedMessage]:
        """Lease up to n for the subscription's ack deadline through the group commit (a
        push subscription: FailedPrecondition)."""
        name = str(names.parse_subscription(subscription))
        granted = await streaming.hub_for(self.state).commits.lease(name, n, None)
        return [
            LeasedMessage(m.ack_id, m.message.message_id, m.message.data, dict(m.message.attributes),
                          m.message.publish_time, m.message.ordering_key, m.delivery_attempt, m.message.size)
            for m in granted.messages
        ]

    @rpc
    async def Pull(self, request: pb.PullRequest, context: Context) -> pb.PullResponse:
        if request.max_messages <= 0:
            raise InvalidArgument("max_messages", f"must be greater than 0, got {request.max_messages}")
        n = min(request.max_messages, MAX_PULL)
        loop = asyncio.get_running_loop()
        remaining = context.time_remaining()
        wait = PULL_WAIT if remaining is None else max(0.0, min(PULL_WAIT, remaining - DEADLINE_MARGIN))
        give_up = loop.time() + wait
        while True:
            seen = self.state.versions()  # before the read: a commit after it ends the wait below
            leased = await self._lease(request.subscription, n)
            if leased or request.return_immediately or loop.time() >= give_up or self.state.stopping.is_set():
                break
            recheck = min(loop.time() + IDLE_RECHECK, give_up)
            while loop.time() < recheck and not self.state.stopping.is_set() and self.state.versions() == seen:
                await asyncio.sleep(WAIT_STEP)
        keep, rest = split_for_response(leased)
        if rest:  # over the client's response limit: give them back now
            body = {"subscription": request.subscription, "ack_ids": [m.ack_id for m in rest], "ack_deadline_seconds": 0}
            try:
                await self.state.run(self.state.subscriber.modify_ack_deadline, request=body)
            except AcknowledgeError:  # exactly-once: an id that did not apply has no lease left to give back
                pass
        return pb.PullResponse(received_messages=[received(m) for m in keep])

    # -- snapshots and seek (issue 15) ----------------------------------------------------------
    @rpc
    async def CreateSnapshot(self, request: pb.CreateSnapshotRequest, context: Context) -> pb.Snapshot:
        body = convert.create_snapshot_request(request)
        # Acks answered from the journal and not yet committed are acks: commit them first, or
        # the snapshot would hold their messages as unacked (a seek to it would redeliver them).
        if request.subscription:
            await streaming.hub_for(self.state).commits.flush(str(names.parse_subscription(request.subscription)))
        snapshot = await self.state.run(self.state.subscriber.create_snapshot, request=body)
        return convert.snapshot_to_proto(snapshot)

    @rpc
    async def GetSnapshot(self, request: pb.GetSnapshotRequest, context: Context) -> pb.Snapshot:
        snapshot = await self.state.run(self.state.subscriber.get_snapshot, request={"snapshot": request.snapshot})
        return convert.snapshot_to_proto(snapshot)

    @rpc
    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context: Context) -> pb.ListSnapshotsResponse:
        body = page_request(("project", request.project), request.page_size, request.page_token)

        def first_page() -> Any:
            return next(iter(self.state.subscriber.list_snapshots(request=body).pages))

        page = await self.state.run(first_page)
        return pb.ListSnapshotsResponse(
            snapshots=[convert.snapshot_to_proto(s) for s in page.snapshots], next_page_token=page.next_page_token
        )

    @rpc
    async def UpdateSnapshot(self, request: pb.UpdateSnapshotRequest, context: Context) -> pb.Snapshot:
        body = convert.snapshot_update(request)
        snapshot = await self.state.run(self.state.subscriber.update_snapshot, request=body)
        return convert.snapshot_to_proto(snapshot)

    @rpc
    async def DeleteSnapshot(self, request: pb.DeleteSnapshotRequest, context: Context) -> empty_pb2.Empty:
        await self.state.run(self.state.subscriber.delete_snapshot, request={"snapshot": request.snapshot})
        return empty_pb2.Empty()

    @rpc
    async def Seek(self, request: pb.SeekRequest, context: Context) -> pb.SeekResponse:
        """One seek commit (the library's), then the subscription's streams here drop the
        leases it ended and ask again (``StreamHub.sought``; the module docstring). They do
        so too when the call ends otherwise after the seek may have committed (cancelled, or
        a failure after the commit): dropping live leases from a stream's count only lets it
        pass its flow limit by that much, keeping dead ones holds the replay back."""
        body = convert.seek_request(request)
        name = str(names.parse_subscription(request.subscription))
        hub = streaming.hub_for(self.state)
        try:
            await self.state.run(self.state.subscriber.seek, request=body)
        except (InvalidArgument, NotFound, FailedPrecondition):
            raise  # refused before anything was written
        except BaseException:
            hub.sought(name)
            raise
        hub.sought(name)
        return pb.SeekResponse()
