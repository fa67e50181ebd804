"""PublisherClient: topics and publishing, shaped like google-cloud-pubsub's."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .. import names
from .._common import ClientBase
from .._requests import fields, required
from ..errors import Cancelled, InvalidArgument
from ..publishing import OutgoingMessage, append, build_rows, from_arrow
from ..types import BatchSettings, PubsubMessage, Topic, validate_labels
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
    """

    def __init__(
        self,
        warehouse: str | None = None,
        *,
        batch_settings: BatchSettings = BatchSettings(),
        create_warehouse: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(warehouse, create_warehouse=create_warehouse, **kwargs)
        if not isinstance(batch_settings, BatchSettings):
            raise InvalidArgument("batch_settings", "must be a deltabus.types.BatchSettings")
        self.batch_settings = batch_settings
        self._batcher: Batcher | None = None
        self._batcher_lock = threading.Lock()
        self._stopped = False

    topic_path = staticmethod(names.topic_path)

    @staticmethod
    def common_project_path(project: str) -> str:
        return f"projects/{names.parse_project(project)}"

    # -- topics ------------------------------------------------------------
    def create_topic(self, request: Mapping[str, Any] | None = None, *, name: str | None = None, labels: Mapping[str, str] | None = None) -> Topic:
        f = fields("create_topic", request, {"name", "labels"}, name=name, labels=labels)
        topic = str(names.parse_topic(required(f, "name", "create_topic"), "name"))
        lbls = validate_labels(f.get("labels"))
        _, registry = self._open(create=True)  # creating a topic may create the warehouse
        return registry.create_topic(topic, lbls).public()

    def get_topic(self, request: Mapping[str, Any] | None = None, *, topic: str | None = None) -> Topic:
        f = fields("get_topic", request, {"topic"}, topic=topic)
        name = str(names.parse_topic(required(f, "topic", "get_topic")))
        return self._registry.topic(name).public()

    def list_topics(self, request: Mapping[str, Any] | None = None, *, project: str | None = None) -> list[Topic]:
        f = fields("list_topics", request, {"project"}, project=project)
        proj = names.parse_project(required(f, "project", "list_topics"))
        prefix = f"projects/{proj}/topics/"
        return [t.public() for n, t in sorted(self._registry.topics().items()) if n.startswith(prefix)]

    def list_topic_subscriptions(self, request: Mapping[str, Any] | None = None, *, topic: str | None = None) -> list[str]:
        f = fields("list_topic_subscriptions", request, {"topic"}, topic=topic)
        name = str(names.parse_topic(required(f, "topic", "list_topic_subscriptions")))
        rec = self._registry.topic(name)
        return sorted(s.name for s in self._registry.subscriptions().values() if s.topic_uid == rec.topic_uid)

    def delete_topic(self, request: Mapping[str, Any] | None = None, *, topic: str | None = None) -> None:
        f = fields("delete_topic", request, {"topic"}, topic=topic)
        name = str(names.parse_topic(required(f, "topic", "delete_topic")))
        self._registry.delete_topic(name)

    # -- publishing --------------------------------------------------------
    def _commit(self, topic: str, messages: Sequence[OutgoingMessage]) -> list[str]:
        rec = self._registry.topic(topic)  # NotFound once the topic is deleted
        rows, ids = build_rows(rec.topic_uid, rec.name, messages, self._clock())
        append(self._engine, rows)
        return ids

    def publish(self, topic: str, data: bytes, ordering_key: str = "", **attrs: str) -> "Future[str]":
        """Publish one message; the future resolves to its message id once committed."""
        name = str(names.parse_topic(topic))
        size = check_message(data, attrs, ordering_key)
        with self._batcher_lock:
            if self._stopped:
                raise Cancelled("publish() on a PublisherClient that was stopped")
            if self._batcher is None:
                self._batcher = Batcher(self._commit, self.batch_settings)
            batcher = self._batcher
        return batcher.submit(name, OutgoingMessage(bytes(data), dict(attrs), ordering_key or "", size))

    def publish_batch(self, topic: str, messages: Iterable[PubsubMessage | Mapping[str, Any]]) -> list[str]:
        """Publish many messages as one Delta commit; return their ids in order.

        All messages are validated first: one bad message fails the call and nothing is written.
        """
        name = str(names.parse_topic(topic))
        out: list[OutgoingMessage] = []
        for i, m in enumerate(messages):
            if isinstance(m, PubsubMessage):
                data, attributes, okey = m.data, m.attributes, m.ordering_key
            elif isinstance(m, Mapping):
                unknown = set(m) - {"data", "attributes", "ordering_key"}
                if unknown:
                    raise InvalidArgument(f"messages[{i}]", f"unknown fields {sorted(unknown)}")
                data, attributes, okey = m.get("data", b""), m.get("attributes") or {}, m.get("ordering_key", "")
            else:
                raise InvalidArgument(f"messages[{i}]", f"must be a PubsubMessage or a dict, got {type(m).__name__}")
            size = check_message(data, attributes, okey, where=f"messages[{i}]")
            out.append(OutgoingMessage(bytes(data), dict(attributes), okey or "", size))
        if not out:
            raise InvalidArgument("messages", "at least one message is required")
        return self._commit(name, out)

    def publish_dataframe(self, topic: str, df: "DataFrame") -> int:
        """Publish every row of a Spark DataFrame as one Delta commit; return the count.

        Columns: ``data`` (binary, or string sent as UTF-8), optional ``attributes``
        (map<string,string>), optional ``ordering_key`` (string). The rows are collected
        to the driver as Arrow and validated before anything is written.
        """
        from ..spark.dataframe import dataframe_to_arrow

        name = str(names.parse_topic(topic))
        rec = self._registry.topic(name)
        table = dataframe_to_arrow(df)
        if table.num_rows == 0:
            return 0
        rows, ids = from_arrow(rec.topic_uid, rec.name, table, self._clock())
        append(self._engine, rows)
        return len(ids)

    # -- lifecycle ---------------------------------------------------------
    def stop(self) -> None:
        """Commit every pending publish, then stop the background batcher."""
        with self._batcher_lock:
            self._stopped = True
            batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.flush_and_stop()

    close = stop

    def __enter__(self) -> "PublisherClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
