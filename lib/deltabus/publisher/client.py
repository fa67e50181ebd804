"""PublisherClient: topics and publishing, shaped like google-cloud-pubsub's."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .. import names, pagination
from ..delivery import detach
from .._closing import refused_when_closed
from .._common import ClientBase
from .._call_args import fields, mask_paths, required
from ..storage.clock import wall
from ..errors import ClientClosed, InvalidArgument, OrderingNotEnabled
from ..pagers import ListTopicsPager, ListTopicSubscriptionsPager
from .rows import OutgoingMessage, append, build_rows, from_arrow
from ..types import (
    BatchSettings,
    DetachSubscriptionResponse,
    ListTopicsResponse,
    ListTopicSubscriptionsResponse,
    PublisherOptions,
    PubsubMessage,
    Topic,
    settings_from_sequence,
    validate_labels,
    validate_topic_retention,
)

# The Topic fields update_topic may change (as Pub/Sub's UpdateTopic, of those deltabus has).
UPDATABLE_TOPIC_FIELDS = ("labels", "message_retention_duration")
from ..validation import check_message
from .batcher import Batcher

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame


class PublisherClient(ClientBase):
    """Publish messages into topics stored as Delta tables under a warehouse.

    ``publish`` batches messages in the background (``batch_settings``) and resolves
    each future with the message id once the batch's Delta commit succeeded.

    The publisher is where topics are made, so by default it creates a missing warehouse
    when constructed. With ``create_warehouse=False`` only ``create_topic`` creates one
    (after validating its request); every other call on a missing warehouse raises
    ``WarehouseNotFound``.

    ``publisher_options=types.PublisherOptions(enable_message_ordering=True)`` lets
    ``publish`` take ordering keys. ``stop()`` commits what is pending and refuses further
    publishing; ``close()`` (and leaving a ``with`` block) does that and refuses every call.
    Both raise ``ClientClosed``, a ``RuntimeError``, as google-cloud-pubsub does.
    """

    def __init__(
        self,
        warehouse: str | None = None,
        *,
        batch_settings: BatchSettings = BatchSettings(),
        publisher_options: PublisherOptions | Sequence[Any] = (),
        create_warehouse: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(batch_settings, BatchSettings):
            raise InvalidArgument("batch_settings", "must be a deltabus.types.BatchSettings")
        if not isinstance(publisher_options, PublisherOptions):  # a tuple, as google-cloud-pubsub takes
            publisher_options = settings_from_sequence(PublisherOptions, publisher_options, "publisher_options")
        self._closed = False
        super().__init__(warehouse, create_warehouse=create_warehouse, **kwargs)
        self.batch_settings = batch_settings
        self.publisher_options = publisher_options
        self._batcher: Batcher | None = None
        self._batcher_lock = threading.Lock()
        self._stopped = False

    topic_path = staticmethod(names.topic_path)

    @staticmethod
    def common_project_path(project: str) -> str:
        return f"projects/{names.parse_project(project)}"

    # -- topics ------------------------------------------------------------
    @refused_when_closed
    def create_topic(self, request: Mapping[str, Any] | None = None, *, name: str | None = None, labels: Mapping[str, str] | None = None) -> Topic:
        """Create a topic. ``request`` may also carry ``message_retention_duration`` (10
        minutes..31 days): every message is kept that long, acked or not, for seek."""
        f = fields("create_topic", request, {"name", "labels", "message_retention_duration"}, name=name, labels=labels)
        topic = str(names.parse_topic(required(f, "name", "create_topic"), "name"))
        lbls = validate_labels(f.get("labels"))
        retention = validate_topic_retention(f.get("message_retention_duration"))
        _, registry = self._open(create=True)  # creating a topic may create the warehouse
        return registry.create_topic(topic, lbls, retention).public()

    @refused_when_closed
    def update_topic(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        topic: Topic | Mapping[str, Any] | None = None,
        update_mask: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    ) -> Topic:
        """Change the topic's fields named in update_mask: ``labels`` and
        ``message_retention_duration`` (unset or 0 in the topic: no retention)."""
        f = fields("update_topic", request, {"topic", "update_mask"}, topic=topic, update_mask=update_mask)
        raw = required(f, "topic", "update_topic")
        paths = mask_paths(f, UPDATABLE_TOPIC_FIELDS, "update_topic")
        if isinstance(raw, Topic):
            values: dict[str, Any] = {"name": raw.name, **{p: getattr(raw, p) for p in paths}}
        elif isinstance(raw, Mapping):
            values = {"name": raw.get("name"), **{p: raw.get(p) for p in paths}}
        else:
            raise InvalidArgument("topic", f"must be a Topic or a dict, got {type(raw).__name__}")
        name = str(names.parse_topic(values["name"], "topic.name"))
        changes: dict[str, Any] = {}
        if "labels" in paths:
            changes["labels"] = validate_labels(values["labels"] or {}, "topic.labels")
        if "message_retention_duration" in paths:
            changes["message_retention_duration"] = validate_topic_retention(
                values["message_retention_duration"], "topic.message_retention_duration"
            )
        return self._registry.update_topic(name, changes).public()

    @refused_when_closed
    def get_topic(self, request: Mapping[str, Any] | None = None, *, topic: str | None = None) -> Topic:
        f = fields("get_topic", request, {"topic"}, topic=topic)
        name = str(names.parse_topic(required(f, "topic", "get_topic")))
        return self._registry.topic(name).public()

    @refused_when_closed
    def list_topics(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        project: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> ListTopicsPager:
        """The project's topics by name, in pages (iterate the pager for all of them)."""
        f = fields("list_topics", request, {"project", "page_size", "page_token"}, project=project, page_size=page_size, page_token=page_token)
        proj = names.parse_project(required(f, "project", "list_topics"))
        size = pagination.page_size(f.get("page_size"))
        scope = f"projects/{proj}"

        def fetch(token: str | None) -> ListTopicsResponse:
            self._refuse_if_closed("list_topics")
            after = pagination.decode_token(token, "topics", scope)
            topics = self._registry.topics()
            page, last = pagination.take_page(sorted(n for n in topics if n.startswith(scope + "/topics/")), after, size)
            nxt = pagination.encode_token("topics", scope, last) if last else ""
            return ListTopicsResponse(topics=[topics[n].public() for n in page], next_page_token=nxt)

        return ListTopicsPager(fetch, fetch(f.get("page_token")))

    @refused_when_closed
    def list_topic_subscriptions(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        topic: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> ListTopicSubscriptionsPager:
        """Names of the topic's attached subscriptions, in pages (a detached one is left out,
        as Pub/Sub lists only the subscriptions attached to the topic)."""
        f = fields("list_topic_subscriptions", request, {"topic", "page_size", "page_token"}, topic=topic, page_size=page_size, page_token=page_token)
        name = str(names.parse_topic(required(f, "topic", "list_topic_subscriptions")))
        size = pagination.page_size(f.get("page_size"))

        def fetch(token: str | None) -> ListTopicSubscriptionsResponse:
            self._refuse_if_closed("list_topic_subscriptions")
            after = pagination.decode_token(token, "topic_subscriptions", name)
            rec = self._registry.topic(name)
            subs = sorted(
                s.name for s in self._registry.subscriptions().values() if s.topic_uid == rec.topic_uid and not s.detached
            )
            page, last = pagination.take_page(subs, after, size)
            nxt = pagination.encode_token("topic_subscriptions", name, last) if last else ""
            return ListTopicSubscriptionsResponse(subscriptions=page, next_page_token=nxt)

        return ListTopicSubscriptionsPager(fetch, fetch(f.get("page_token")))

    @refused_when_closed
    def delete_topic(self, request: Mapping[str, Any] | None = None, *, topic: str | None = None) -> None:
        f = fields("delete_topic", request, {"topic"}, topic=topic)
        name = str(names.parse_topic(required(f, "topic", "delete_topic")))
        self._registry.delete_topic(name)

    @refused_when_closed
    def detach_subscription(
        self, request: Mapping[str, Any] | None = None, *, subscription: str | None = None
    ) -> DetachSubscriptionResponse:
        """Detach a subscription from its topic, as Pub/Sub's DetachSubscription: it keeps
        existing with ``detached=True``, its messages are dropped, nothing more is fanned out
        to it, and pull, acks, deadline changes and pushes on it stop (FailedPrecondition).
        Two commits: the registry's mark, then the backlog dropped in one deliveries commit
        (``delivery.detach``). Detaching again is allowed and finishes a detach a crash cut
        short. NotFound when the subscription does not exist."""
        f = fields("detach_subscription", request, {"subscription"}, subscription=subscription)
        name = str(names.parse_subscription(required(f, "subscription", "detach_subscription")))
        rec = self._registry.detach_subscription(name)
        detach.drop_backlog(self._engine, rec)
        return DetachSubscriptionResponse()

    # -- publishing --------------------------------------------------------
    def _commit(self, topic: str, messages: Sequence[OutgoingMessage]) -> list[str]:
        rec = self._registry.topic(topic)  # NotFound once the topic is deleted
        rows, ids = build_rows(rec.topic_uid, rec.name, messages, wall(self._clock)())
        append(self._engine, rows)
        return ids

    def _refuse_if_closed(self, method: str) -> None:
        if self._closed:
            raise ClientClosed(f"PublisherClient.{method}(): the client is closed; create a new one")

    def _refuse_if_stopped(self, method: str) -> None:
        self._refuse_if_closed(method)
        if self._stopped:
            raise ClientClosed(f"PublisherClient.{method}(): cannot publish on a stopped publisher; create a new one")

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **attrs: str) -> "Future[str]":
        """Publish one message; the future resolves to its message id once committed.

        An ``ordering_key`` needs ``PublisherOptions(enable_message_ordering=True)``: without
        it this raises OrderingNotEnabled (a ValueError, as google-cloud-pubsub raises, and a
        RuntimeError) and publishes nothing. A publish that fails pauses its ordering key:
        later publishes with that key fail (OrderingKeyPaused, nothing written) until
        ``resume_publish(topic, ordering_key)`` (see ``batcher``).
        """
        self._refuse_if_stopped("publish")
        if ordering_key and not self.publisher_options.enable_message_ordering:
            raise OrderingNotEnabled(
                "Cannot publish a message with an ordering key: message ordering is not enabled in the "
                "publisher options (PublisherClient(publisher_options=types.PublisherOptions(enable_message_ordering=True)))"
            )
        name = str(names.parse_topic(topic))
        size = check_message(data, attrs, ordering_key)
        with self._batcher_lock:
            self._refuse_if_stopped("publish")  # stop() may have run since the check above
            if self._batcher is None:
                self._batcher = Batcher(self._commit, self.batch_settings)
            batcher = self._batcher
        return batcher.submit(name, OutgoingMessage(bytes(data), dict(attrs), ordering_key or "", size))

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        """Resume publishing with `ordering_key` on `topic` after a failed publish paused it
        (publishes with a paused key fail at once with OrderingKeyPaused, written nowhere).
        Needs ``PublisherOptions(enable_message_ordering=True)`` (OrderingNotEnabled
        otherwise, as google-cloud-pubsub). A key that is not paused is left as it is."""
        self._refuse_if_closed("resume_publish")
        if not self.publisher_options.enable_message_ordering:
            raise OrderingNotEnabled(
                "Cannot resume publishing with an ordering key: message ordering is not enabled in the publisher options"
            )
        name = str(names.parse_topic(topic))
        with self._batcher_lock:
            batcher = self._batcher
        if batcher is not None:
            batcher.resume(name, ordering_key)

    def publish_batch(
        self,
        topic: str | None = None,
        messages: Iterable[PubsubMessage | Mapping[str, Any]] | None = None,
        *,
        request: Mapping[str, Any] | None = None,
    ) -> list[str]:
        """Publish many messages as one Delta commit; return their ids in order.

        Like Pub/Sub's Publish RPC (``request={"topic": ..., "messages": [...]}`` works too),
        and unlike ``publish``, it takes ordering keys without ``enable_message_ordering``:
        one call is one commit, so its messages keep their order anyway.
        All messages are validated first: one bad message fails the call and nothing is written.
        """
        self._refuse_if_stopped("publish_batch")
        f = fields("publish_batch", request, {"topic", "messages"}, topic=topic, messages=messages)
        name = str(names.parse_topic(required(f, "topic", "publish_batch")))
        given = required(f, "messages", "publish_batch")
        if isinstance(given, (str, bytes, Mapping)) or not isinstance(given, Iterable):
            raise InvalidArgument("messages", f"must be a list of PubsubMessage or dicts, got {type(given).__name__}")
        out: list[OutgoingMessage] = []
        for i, m in enumerate(given):
            if isinstance(m, PubsubMessage):
                data, attributes, okey = m.data, m.attributes, m.ordering_key
            elif isinstance(m, Mapping):
                unknown = set(m) - {"data", "attributes", "ordering_key"}
                if unknown:
                    raise InvalidArgument(f"messages[{i}]", f"unknown fields {sorted(unknown, key=str)}")
                data, attributes, okey = m.get("data", b""), m.get("attributes") or {}, m.get("ordering_key", "")
            else:
                raise InvalidArgument(f"messages[{i}]", f"must be a PubsubMessage or a dict, got {type(m).__name__}")
            size = check_message(data, attributes, okey, where=f"messages[{i}]")
            out.append(OutgoingMessage(bytes(data), dict(attributes), okey or "", size))
        if not out:
            raise InvalidArgument("messages", "at least one message is required")
        return self._commit(name, out)

    def publish_dataframe(self, topic: str | None = None, df: "DataFrame | None" = None, *, request: Mapping[str, Any] | None = None) -> int:
        """Publish every row of a Spark DataFrame as one Delta commit; return the count.

        Columns: ``data`` (binary, or string sent as UTF-8), optional ``attributes``
        (map<string,string>), optional ``ordering_key`` (string; like ``publish_batch``,
        one commit, so no ``enable_message_ordering`` needed). The rows are collected to the
        driver as Arrow and validated before anything is written.
        ``request={"topic": ..., "dataframe": df}`` works too.
        """
        from ..spark.dataframe import dataframe_to_arrow

        self._refuse_if_stopped("publish_dataframe")
        f = fields("publish_dataframe", request, {"topic", "dataframe"}, topic=topic, dataframe=df)
        name = str(names.parse_topic(required(f, "topic", "publish_dataframe")))
        frame = required(f, "dataframe", "publish_dataframe")
        rec = self._registry.topic(name)
        table = dataframe_to_arrow(frame)
        if table.num_rows == 0:
            return 0
        rows, ids = from_arrow(rec.topic_uid, rec.name, table, wall(self._clock)())
        append(self._engine, rows)
        return len(ids)

    # -- lifecycle ---------------------------------------------------------
    def stop(self) -> None:
        """Commit every pending publish, stop the background batcher, refuse further publishing.

        Topic calls still work, as after google-cloud-pubsub's ``stop()``; ``close()`` ends those too.
        """
        with self._batcher_lock:
            self._stopped = True
            batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.flush_and_stop()

    def close(self) -> None:
        """``stop()``, then refuse every call (ClientClosed). Idempotent."""
        self.stop()
        self._closed = True

    def __enter__(self) -> "PublisherClient":
        if self._closed:
            raise ClientClosed("a closed PublisherClient cannot be used as a context manager")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
