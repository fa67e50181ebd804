"""The ``google.pubsub.v1.Publisher`` service of `deltabus serve`.

Each method turns its proto-plus request into the deltabus PublisherClient's request dict
(``convert``) and runs the client's own method on the server's thread pool, so names,
labels and message limits are checked by the same code as the Python client's; an error
aborts the call with its Pub/Sub status (``status``) and writes nothing.

- Publish: all of a request's messages are validated first (the library's name and
  message rules), and one bad message fails the request with nothing written. Valid
  requests go through the Publish group commit (``publish_commit``): the requests that
  arrive while an append runs share the next append, so a request is never split over
  commits, and a commit may hold several requests.
- UpdateTopic: ``labels`` and ``message_retention_duration`` are the updatable fields.
- ListTopicSnapshots: the names of the snapshots of the topic (issue 15; those whose
  ``topic`` is its name), in pages as the other listings; NOT_FOUND for a topic that does
  not exist.
- DetachSubscription: the PublisherClient's ``detach_subscription`` (``delivery.detach``):
  the subscription stays, shown with ``detached`` true, its backlog is dropped in one
  commit, and Pull, StreamingPull, Acknowledge and ModifyAckDeadline on it answer
  FAILED_PRECONDITION (an open stream ends so at its next round); NOT_FOUND when it does
  not exist.
"""

from __future__ import annotations

from typing import Any

import grpc.aio
from google.protobuf import empty_pb2
from google.pubsub_v1 import types as pb

from .. import names, pagination
from ..errors import InvalidArgument
from ..publisher.rows import OutgoingMessage
from ..validation import check_message
from ..publisher.client import UPDATABLE_TOPIC_FIELDS
from . import convert, streaming
from .calls import rpc
from .state import ServerState

Context = grpc.aio.ServicerContext[Any, Any]


def page_request(project_or_name: tuple[str, str], page_size: int, page_token: str) -> dict[str, Any]:
    key, value = project_or_name
    out: dict[str, Any] = {key: value}
    if page_size:
        out["page_size"] = page_size
    if page_token:
        out["page_token"] = page_token
    return out


class PublisherService:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    @rpc
    async def CreateTopic(self, request: pb.Topic, context: Context) -> pb.Topic:
        body = convert.topic_request(request)
        topic = await self.state.run(self.state.publisher.create_topic, request=body)
        return convert.topic_to_proto(topic)

    @rpc
    async def UpdateTopic(self, request: pb.UpdateTopicRequest, context: Context) -> pb.Topic:
        paths = convert.mask_paths(request.update_mask if "update_mask" in request else None)
        bad = [p for p in paths if p not in UPDATABLE_TOPIC_FIELDS]
        if bad:
            raise InvalidArgument("update_mask", f"cannot update {bad}; updatable fields: {list(UPDATABLE_TOPIC_FIELDS)}")
        body = {"name": request.topic.name, **convert.topic_request(request.topic)}
        topic = await self.state.run(self.state.publisher.update_topic, topic=body, update_mask=paths)
        return convert.topic_to_proto(topic)

    @rpc
    async def Publish(self, request: pb.PublishRequest, context: Context) -> pb.PublishResponse:
        topic = str(names.parse_topic(request.topic))
        if not request.messages:
            raise InvalidArgument("messages", "at least one message is required")
        messages = []
        for i, m in enumerate(convert.raw(request).messages):
            d = convert.message_request(m)
            size = check_message(d["data"], d["attributes"], d["ordering_key"], where=f"messages[{i}]")
            messages.append(OutgoingMessage(d["data"], d["attributes"], d["ordering_key"], size))
        ids = await streaming.hub_for(self.state).publishes.publish(topic, messages)
        streaming.hub_for(self.state).published(request.topic)  # wake that topic's waiting streams now
        return pb.PublishResponse(message_ids=ids)

    @rpc
    async def GetTopic(self, request: pb.GetTopicRequest, context: Context) -> pb.Topic:
        topic = await self.state.run(self.state.publisher.get_topic, request={"topic": request.topic})
        return convert.topic_to_proto(topic)

    @rpc
    async def ListTopics(self, request: pb.ListTopicsRequest, context: Context) -> pb.ListTopicsResponse:
        body = page_request(("project", request.project), request.page_size, request.page_token)

        def first_page() -> Any:
            return next(iter(self.state.publisher.list_topics(request=body).pages))

        page = await self.state.run(first_page)
        return pb.ListTopicsResponse(
            topics=[convert.topic_to_proto(t) for t in page.topics], next_page_token=page.next_page_token
        )

    @rpc
    async def ListTopicSubscriptions(
        self, request: pb.ListTopicSubscriptionsRequest, context: Context
    ) -> pb.ListTopicSubscriptionsResponse:
        body = page_request(("topic", request.topic), request.page_size, request.page_token)

        def first_page() -> Any:
            return next(iter(self.state.publisher.list_topic_subscriptions(request=body).pages))

        page = await self.state.run(first_page)
        return pb.ListTopicSubscriptionsResponse(subscriptions=list(page.subscriptions), next_page_token=page.next_page_token)

    @rpc
    async def ListTopicSnapshots(self, request: pb.ListTopicSnapshotsRequest, context: Context) -> pb.ListTopicSnapshotsResponse:
        topic = str(names.parse_topic(request.topic))
        size = pagination.page_size(request.page_size)
        after = pagination.decode_token(request.page_token, "topic_snapshots", topic)

        def page() -> tuple[list[str], str | None]:
            self.state.publisher.get_topic(request={"topic": topic})  # NOT_FOUND
            project = f"projects/{names.parse_topic(topic).project}"
            of_topic = sorted(s.name for s in self.state.subscriber.list_snapshots(project=project) if s.topic == topic)
            return pagination.take_page(of_topic, after, size)

        found, last = await self.state.run(page)
        nxt = pagination.encode_token("topic_snapshots", topic, last) if last else ""
        return pb.ListTopicSnapshotsResponse(snapshots=found, next_page_token=nxt)

    @rpc
    async def DeleteTopic(self, request: pb.DeleteTopicRequest, context: Context) -> empty_pb2.Empty:
        await self.state.run(self.state.publisher.delete_topic, request={"topic": request.topic})
        return empty_pb2.Empty()

    @rpc
    async def DetachSubscription(self, request: pb.DetachSubscriptionRequest, context: Context) -> pb.DetachSubscriptionResponse:
        await self.state.run(self.state.publisher.detach_subscription, request={"subscription": request.subscription})
        return pb.DetachSubscriptionResponse()
