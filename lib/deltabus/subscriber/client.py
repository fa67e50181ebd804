"""SubscriberClient: subscriptions, pull, ack, deadlines and streaming pull."""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from .. import ackid, backlog, config, names, pagination, subscription_fields, watch
from ..activity import ActivityRecorder
from ..storage.clock import wall
from ..watch import LogWatcher
from ..delivery import dead_letter, operations as delivery
from ..delivery.history import HistorySettings
from ..delivery.payloads import fetch_messages, received_messages
from .._closing import refused_when_closed
from .._common import ClientBase
from .._call_args import fields, mask_paths, required
from ..delivery.model import DeliveryRef, Result
from ..errors import AcknowledgeError, AcknowledgeStatus, ClientClosed, FailedPrecondition, InvalidArgument, SubscriptionDetached, export_pull_refused
from ..delivery import seek as seeking
from ..pagers import ListSnapshotsPager, ListSubscriptionsPager
from ..snapshots import Snapshots
from ..registry import SubscriptionRecord
from ..validation import endpoint_scheme
from ..types import (
    MAX_ACK_DEADLINE,
    FlowControl,
    ListSnapshotsResponse,
    ListSubscriptionsResponse,
    PullResponse,
    PushConfig,
    ReceivedMessage,
    SeekResponse,
    Snapshot,
    Subscription,
    settings_from_sequence,
    timestamp_seconds,
    validate_labels,
)
from .message import Message
from .streaming_pull import StreamingPullManager

log = logging.getLogger(__name__)

MAX_PULL_MESSAGES = 10_000
DEFAULT_PULL_TIMEOUT = 10.0
# Derived from the declaration of a subscription's fields.
_UPDATABLE = set(subscription_fields.UPDATABLE)
# The longest a waiting pull or stream sleeps without a commit before it reads again: lease
# expiries make no commit (the old sleep-poll backed off to 0.5 s as well).
IDLE_RECHECK = 0.5
# The shortest time between the starts of two reads that found nothing: commits of other
# topics also wake a waiter, and a busy warehouse must not turn waiting into a loop of reads.
MIN_RECHECK = 0.1


class SubscriberClient(ClientBase):
    """Create subscriptions and receive messages by pull or streaming pull.

    ``close()`` (and leaving a ``with`` block) stops every ``subscribe()`` stream, nacking
    what they held, and then refuses every call with ``ClientClosed`` (a RuntimeError).
    """

    _history_settings: HistorySettings
    _history_asked: bool

    @property
    def _history(self) -> HistorySettings:
        """The history settings of this client's writes: off on the delta-spark engine, not
        yet recorded there (README "Delivery history", "Engines"); asked for explicitly there,
        refused. Read at the first write, as the warehouse may open only then."""
        h = self._history_settings
        if h.enabled and self._engine.name == "delta-spark":
            if self._history_asked:
                raise InvalidArgument("history", "the delta-spark engine does not record the delivery history yet; "
                                                 "use the delta-rs engine, or history=False")
            h = self._history_settings = HistorySettings(enabled=False)
        return h

    def __init__(
        self, warehouse: str | None = None, *, allow_http: bool | None = None, history: bool | None = None, **kwargs: Any
    ) -> None:
        """`history`: record the delivery history of this client's pulls, acks and nacks
        (default: the settings' ``history``, on)."""
        self._closed = False
        super().__init__(warehouse, **kwargs)
        on = history if history is not None else (self._settings.history if self._settings is not None else True)
        self._history_asked = bool(history)  # asked for explicitly: refused on delta-spark (_history)
        self._history_settings = HistorySettings(enabled=bool(on))
        if allow_http is not None:
            self._allow_http = bool(allow_http)
        else:  # DELTABUS_ALLOW_HTTP, read only when not given; an unrecognised value is false (as before)
            self._allow_http = self._settings.allow_http if self._settings is not None else config.client_allow_http()
        self._streams: list[StreamingPullManager] = []
        self._streams_lock = threading.Lock()
        self._activity: ActivityRecorder | None = None  # for expiration policies; made on first use (the warehouse opens lazily)
        self._snapshot_registry: tuple[Any, Snapshots] | None = None  # (engine, registry), made on first use

    subscription_path = staticmethod(names.subscription_path)
    topic_path = staticmethod(names.topic_path)
    snapshot_path = staticmethod(names.snapshot_path)

    # -- validation helpers ------------------------------------------------------
    def _check_push(self, push: PushConfig) -> PushConfig:
        if endpoint_scheme(push.push_endpoint) == "http" and not self._allow_http:
            raise InvalidArgument(
                "push_config.push_endpoint",
                "must be https; plain http needs allow_http (conf) or DELTABUS_ALLOW_HTTP=1 (for localhost and tests)",
            )
        return push

    def _used(self, rec: SubscriptionRecord) -> None:
        """Record that `rec` was used (its expiration policy counts from the last use)."""
        if self._activity is None:
            with self._streams_lock:
                if self._activity is None:
                    self._activity = ActivityRecorder(self._registry, wall(self._clock))
        self._activity.used(rec)

    def _sub(self, name: Any, field: str = "subscription") -> SubscriptionRecord:
        return self._registry.subscription(str(names.parse_subscription(name, field)))

    # -- administration ----------------------------------------------------------
    @refused_when_closed
    def create_subscription(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        topic: str | None = None,
        push_config: PushConfig | Mapping[str, Any] | None = None,
        ack_deadline_seconds: int | None = None,
        labels: Mapping[str, str] | None = None,
        enable_message_ordering: bool | None = None,
    ) -> Subscription:
        f = fields(
            "create_subscription",
            request,
            {fld.name for fld in subscription_fields.SETTABLE},
            name=name,
            topic=topic,
            push_config=push_config,
            ack_deadline_seconds=ack_deadline_seconds,
            labels=labels,
            enable_message_ordering=enable_message_ordering,
        )
        settings = subscription_fields.create_settings(f, {"push_config": self._check_push})
        subscription_fields.check_exactly_once(settings)
        subscription_fields.check_delivery_kind(settings)
        topic_rec = self._registry.topic(settings.topic)
        dead_letter.check_topic(self._registry, settings.dead_letter_policy)  # issue 13: NotFound, nothing written
        rec = self._registry.create_subscription(settings, topic_rec)
        return rec.public()

    @refused_when_closed
    def get_subscription(self, request: Mapping[str, Any] | None = None, *, subscription: str | None = None) -> Subscription:
        f = fields("get_subscription", request, {"subscription"}, subscription=subscription)
        rec = self._sub(required(f, "subscription", "get_subscription"))
        return rec.public(self._registry.topic_is_live(rec.topic_uid))

    @refused_when_closed
    def list_subscriptions(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        project: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> ListSubscriptionsPager:
        """The project's subscriptions by name, in pages (iterate the pager for all of them)."""
        f = fields(
            "list_subscriptions", request, {"project", "page_size", "page_token"},
            project=project, page_size=page_size, page_token=page_token,
        )
        proj = names.parse_project(required(f, "project", "list_subscriptions"))
        size = pagination.page_size(f.get("page_size"))
        scope = f"projects/{proj}"

        def fetch(token: str | None) -> ListSubscriptionsResponse:
            if self._closed:
                raise ClientClosed("SubscriberClient.list_subscriptions(): the client is closed; create a new one")
            after = pagination.decode_token(token, "subscriptions", scope)
            subs = self._registry.subscriptions()
            page, last = pagination.take_page(sorted(n for n in subs if n.startswith(scope + "/subscriptions/")), after, size)
            nxt = pagination.encode_token("subscriptions", scope, last) if last else ""
            items = [subs[n].public(self._registry.topic_is_live(subs[n].topic_uid)) for n in page]
            return ListSubscriptionsResponse(subscriptions=items, next_page_token=nxt)

        return ListSubscriptionsPager(fetch, fetch(f.get("page_token")))

    @refused_when_closed
    def update_subscription(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        subscription: Subscription | Mapping[str, Any] | None = None,
        update_mask: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    ) -> Subscription:
        """Change the fields named in update_mask (the updatable ones, as Pub/Sub's:
        ack_deadline_seconds, push_config, labels, retry_policy, dead_letter_policy, delta_config; see
        ``subscription_fields.UPDATABLE``). A path whose field the subscription leaves unset
        (None) clears it: ``retry_policy`` or ``dead_letter_policy`` then means no policy.
        ``filter`` and ``enable_message_ordering`` are fixed at creation."""
        f = fields("update_subscription", request, {"subscription", "update_mask"}, subscription=subscription, update_mask=update_mask)
        raw = required(f, "subscription", "update_subscription")
        paths = mask_paths(f, _UPDATABLE, "update_subscription")
        sub_name: Any  # checked by _sub, which names subscription.name
        if isinstance(raw, Subscription):
            values: dict[str, Any] = {p: getattr(raw, p) for p in paths}
            sub_name = raw.name
        elif isinstance(raw, Mapping):
            sub_name = raw.get("name")
            values = {p: raw.get(p) for p in paths}
        else:
            raise InvalidArgument("subscription", f"must be a Subscription or a dict, got {type(raw).__name__}")
        rec = self._sub(sub_name, "subscription.name")
        changes = subscription_fields.update_changes(values, paths, {"push_config": self._check_push})
        subscription_fields.check_exactly_once(
            replace(rec, **changes),
            "subscription.delta_config" if "delta_config" in changes and "enable_exactly_once_delivery" not in changes
            else "subscription.enable_exactly_once_delivery")
        subscription_fields.check_delivery_kind(
            replace(rec, **changes), "subscription.delta_config" if "delta_config" in changes else "subscription.push_config")
        if "dead_letter_policy" in changes:  # issue 13: the new topic exists; the old policy's moves finish first
            dead_letter.check_topic(self._registry, changes["dead_letter_policy"])
            dead_letter.settle_before_change(self._engine, rec, self._clock, self._registry)
        new = self._registry.replace_subscription(replace(rec, **changes))
        return new.public(self._registry.topic_is_live(new.topic_uid))

    @refused_when_closed
    def modify_push_config(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        subscription: str | None = None,
        push_config: PushConfig | Mapping[str, Any] | None = None,
    ) -> None:
        """Set the push configuration; an empty endpoint turns the subscription into pull."""
        f = fields("modify_push_config", request, {"subscription", "push_config"}, subscription=subscription, push_config=push_config)
        name = required(f, "subscription", "modify_push_config")
        if "push_config" not in f:
            raise InvalidArgument("push_config", "modify_push_config requires push_config (an empty one means pull)")
        push = self._check_push(PushConfig.coerce(f["push_config"]))
        rec = replace(self._sub(name), push_config=push)
        subscription_fields.check_exactly_once(rec, "push_config")
        subscription_fields.check_delivery_kind(rec, "push_config")
        self._registry.replace_subscription(rec)

    @refused_when_closed
    def delete_subscription(self, request: Mapping[str, Any] | None = None, *, subscription: str | None = None) -> None:
        f = fields("delete_subscription", request, {"subscription"}, subscription=subscription)
        name = str(names.parse_subscription(required(f, "subscription", "delete_subscription")))
        self._registry.delete_subscription(name)

    # -- seek and snapshots (issue 15) ------------------------------------------------
    @property
    def _snapshots(self) -> Snapshots:
        made = self._snapshot_registry
        if made is None or made[0] is not self._engine:
            made = (self._engine, Snapshots(self._engine, clock=self._clock))
            self._snapshot_registry = made
        return made[1]

    def _snapshot_name(self, value: Any, field: str = "snapshot") -> str:
        return str(names.parse_snapshot(value, field))

    @refused_when_closed
    def seek(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        subscription: str | None = None,
        time: Any = None,
        snapshot: str | None = None,
    ) -> SeekResponse:
        """Seek a subscription to a time or to a snapshot (Pub/Sub's ``Seek``; the request
        names ``subscription`` and exactly one of ``time`` and ``snapshot``).

        To a time: messages published before it count as acked; those published at or after
        it are unacked: the ones unacked now, and the acked ones that retention keeps (the
        topic's ``message_retention_duration``, or the subscription's with
        ``retain_acked_messages``). To a snapshot of the same topic: unacked are exactly the
        messages unacked when it was taken and every message published after.
        Outstanding leases end: those messages are delivered again, and acks of deliveries
        made before the seek no longer apply. See README "Retention, seek and snapshots"."""
        f = fields("seek", request, {"subscription", "time", "snapshot"}, subscription=subscription, time=time, snapshot=snapshot)
        rec = self._sub(required(f, "subscription", "seek"))
        when, snapshot = f.get("time"), f.get("snapshot")
        if (when is None) == (snapshot in (None, "")):
            raise InvalidArgument("seek", "give exactly one of time and snapshot")
        if when is not None:
            at = timestamp_seconds(when, "time")
            topics = self._registry.topics()
            topic = next((t for t in topics.values() if t.topic_uid == rec.topic_uid), None)
            seeking.seek_to_time(self._engine, rec, at, topic=topic, clock=self._clock)
        else:
            snap = self._snapshots.get(self._snapshot_name(snapshot))
            seeking.seek_to_snapshot(self._engine, rec, snap, self._snapshots.messages_of_live(snap), clock=self._clock)
        self._used(rec)
        return SeekResponse()

    @refused_when_closed
    def create_snapshot(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        name: str | None = None,
        subscription: str | None = None,
    ) -> Snapshot:
        """Snapshot a subscription's acked/unacked state now (Pub/Sub's ``CreateSnapshot``):
        its unacked messages and everything published after. AlreadyExists when the name is
        taken; FailedPrecondition when its oldest unacked message is so old that the
        snapshot would expire within the hour. ``request`` may carry ``labels``."""
        f = fields("create_snapshot", request, {"name", "subscription", "labels"}, name=name, subscription=subscription)
        snap_name = self._snapshot_name(required(f, "name", "create_snapshot"), "name")
        labels = validate_labels(f.get("labels"))
        rec = self._sub(required(f, "subscription", "create_snapshot"))
        made = seeking.create_snapshot(self._engine, self._snapshots, snap_name, rec, labels, clock=self._clock)
        return made.public()

    @refused_when_closed
    def get_snapshot(self, request: Mapping[str, Any] | None = None, *, snapshot: str | None = None) -> Snapshot:
        f = fields("get_snapshot", request, {"snapshot"}, snapshot=snapshot)
        return self._snapshots.get(self._snapshot_name(required(f, "snapshot", "get_snapshot"))).public()

    @refused_when_closed
    def list_snapshots(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        project: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> ListSnapshotsPager:
        """The project's snapshots by name, in pages (iterate the pager for all of them)."""
        f = fields(
            "list_snapshots", request, {"project", "page_size", "page_token"},
            project=project, page_size=page_size, page_token=page_token,
        )
        proj = names.parse_project(required(f, "project", "list_snapshots"))
        size = pagination.page_size(f.get("page_size"))
        scope = f"projects/{proj}"

        def fetch(token: str | None) -> ListSnapshotsResponse:
            if self._closed:
                raise ClientClosed("SubscriberClient.list_snapshots(): the client is closed; create a new one")
            after = pagination.decode_token(token, "snapshots", scope)
            snaps = self._snapshots.all()
            page, last = pagination.take_page(sorted(n for n in snaps if n.startswith(scope + "/snapshots/")), after, size)
            nxt = pagination.encode_token("snapshots", scope, last) if last else ""
            return ListSnapshotsResponse(snapshots=[snaps[n].public() for n in page], next_page_token=nxt)

        return ListSnapshotsPager(fetch, fetch(f.get("page_token")))

    @refused_when_closed
    def update_snapshot(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        snapshot: Snapshot | Mapping[str, Any] | None = None,
        update_mask: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    ) -> Snapshot:
        """Change a snapshot's ``labels`` (the one field deltabus lets change; Pub/Sub's
        expire_time is set by the snapshot's messages)."""
        f = fields("update_snapshot", request, {"snapshot", "update_mask"}, snapshot=snapshot, update_mask=update_mask)
        raw = required(f, "snapshot", "update_snapshot")
        mask_paths(f, ("labels",), "update_snapshot")
        snap_name: Any
        labels: Any
        if isinstance(raw, Snapshot):
            snap_name, labels = raw.name, raw.labels
        elif isinstance(raw, Mapping):
            snap_name, labels = raw.get("name"), raw.get("labels")
        else:
            raise InvalidArgument("snapshot", f"must be a Snapshot or a dict, got {type(raw).__name__}")
        checked = validate_labels(labels or {}, "snapshot.labels")
        return self._snapshots.update_labels(self._snapshot_name(snap_name, "snapshot.name"), checked).public()

    @refused_when_closed
    def delete_snapshot(self, request: Mapping[str, Any] | None = None, *, snapshot: str | None = None) -> None:
        f = fields("delete_snapshot", request, {"snapshot"}, snapshot=snapshot)
        self._snapshots.delete(self._snapshot_name(required(f, "snapshot", "delete_snapshot")))

    # -- pull ------------------------------------------------------------------------
    def _export_lease(self, subscription: str, max_messages: int, max_bytes: int | None = None) -> list[ReceivedMessage]:
        """The Delta exporter's own lease path (the only one an export subscription allows);
        `max_bytes` bounds the leased messages' sizes (the first goes even when larger)."""
        rec = self._sub(subscription)
        if rec.detached:
            raise SubscriptionDetached(subscription)
        return self._pull_record(rec, max_messages, rec.ack_deadline_seconds, export=True, max_bytes=max_bytes)

    def _pull_received(self, subscription: str, max_messages: int, lease_seconds: float) -> list[ReceivedMessage]:
        return self._pull_record(self._sub(subscription), max_messages, lease_seconds)

    def _pull_record(self, rec: SubscriptionRecord, max_messages: int, lease_seconds: float,
                     *, export: bool = False, max_bytes: int | None = None) -> list[ReceivedMessage]:
        if rec.push_config.is_push:
            raise FailedPrecondition(f"{rec.name} is a push subscription; pull needs an empty push endpoint")
        if rec.delta_config is not None and not export:
            raise FailedPrecondition(export_pull_refused(rec.name))
        leases = delivery.pull(
            self._engine, rec, max_messages=max_messages, lease_seconds=lease_seconds, clock=self._clock, history=self._history,
            max_bytes=max_bytes,
        )
        self._used(rec)
        if not leases:
            return []
        payloads = fetch_messages(self._engine, rec.topic_uid, [l.message_id for l in leases])
        return received_messages(rec.sub_uid, rec.name, leases, payloads, with_attempts=True)

    @refused_when_closed
    def pull(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        subscription: str | None = None,
        max_messages: int | None = None,
        return_immediately: bool | None = None,
        timeout: float | None = None,
    ) -> PullResponse:
        """Lease up to max_messages messages for the subscription's ack deadline.

        Without return_immediately, waits up to `timeout` seconds (default 10) for a message.
        """
        f = fields(
            "pull", request, {"subscription", "max_messages", "return_immediately"},
            subscription=subscription, max_messages=max_messages, return_immediately=return_immediately,
        )
        name = str(names.parse_subscription(required(f, "subscription", "pull")))
        n = required(f, "max_messages", "pull")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PULL_MESSAGES:
            raise InvalidArgument("max_messages", f"must be an integer 1..{MAX_PULL_MESSAGES}, got {n!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidArgument("timeout", f"must be a number of seconds >= 0, got {timeout!r}")
        wait = DEFAULT_PULL_TIMEOUT if timeout is None else float(timeout)
        give_up = time.monotonic() + wait
        immediately = bool(f.get("return_immediately"))
        log_watcher, uris = (None, []) if immediately else self._log_watch()
        while True:
            # Versions known before the read: a commit after this point always ends the wait below.
            seen = log_watcher.current(uris) if log_watcher is not None else {}
            started = time.monotonic()
            rec = self._sub(name)
            received = self._pull_received(name, n, rec.ack_deadline_seconds)
            if received or immediately or time.monotonic() >= give_up:
                return PullResponse(received_messages=received)
            assert log_watcher is not None
            # Until a commit to messages or deliveries, or IDLE_RECHECK at most: lease expiries
            # make no commit, and a nack or expiry elsewhere must be seen within that time.
            log_watcher.wait_newer(seen, min(IDLE_RECHECK, max(0.0, give_up - time.monotonic())))
            time.sleep(max(0.0, min(started + MIN_RECHECK, give_up) - time.monotonic()))

    def _log_watch(self) -> tuple[LogWatcher, list[str]]:
        """This process's log watcher, following this warehouse's messages and deliveries tables
        (where a pull's news comes from: new messages, and nacks or expiries of leases)."""
        engine = self._engine
        lw = watch.watcher()
        uris = []
        for table in ("messages", "deliveries"):
            uri = engine.table_uri(table)
            lw.watch(uri, functools.partial(engine.version, table))
            uris.append(uri)
        return lw, uris

    @staticmethod
    def _decoded(ack_ids: Any) -> list[tuple[str, ackid.AckId]]:
        """Each ack id with its decoded form; InvalidArgument naming ``ack_ids[i]`` for a bad one."""
        if isinstance(ack_ids, str) or not isinstance(ack_ids, Iterable):
            raise InvalidArgument("ack_ids", "must be a list of ack ids")
        out = [(a, ackid.decode(a, f"ack_ids[{i}]")) for i, a in enumerate(ack_ids)]
        if not out:
            raise InvalidArgument("ack_ids", "at least one ack id is required")
        return out

    def _decode(self, rec: SubscriptionRecord, ack_ids: Any) -> list[DeliveryRef]:
        # Ack ids of another subscription (or of an earlier incarnation of this one) are ignored.
        return [(d.message_id, d.delivery_attempt, d.message_version) for _, d in self._decoded(ack_ids) if d.sub_uid == rec.sub_uid]

    def _results(self, rec: SubscriptionRecord, ack_ids: Sequence[str], seconds: int | None) -> dict[str, AcknowledgeStatus]:
        """Ack (`seconds` None) or change the deadline of `ack_ids`, reading the rows first, and
        return each ack id's status: SUCCESS only when this call applied it (exactly-once)."""
        decoded = self._decoded(ack_ids)
        mine = [(a, (d.message_id, d.delivery_attempt, d.message_version)) for a, d in decoded if d.sub_uid == rec.sub_uid]
        out = {a: AcknowledgeStatus.INVALID_ACK_ID for a, _ in decoded}  # another subscription's: never applies
        if mine:
            items = [ref for _, ref in mine]
            if seconds is None:
                found = delivery.acknowledge_results(self._engine, rec, items, history=self._history, clock=self._clock)
            else:
                found = delivery.modify_deadline_results(self._engine, rec, items, seconds, clock=self._clock, history=self._history)
            for (a, _), r in zip(mine, found):
                out[a] = AcknowledgeStatus.SUCCESS if r.result is Result.SUCCESS else AcknowledgeStatus.INVALID_ACK_ID
        self._used(rec)
        return out

    @staticmethod
    def _raise_failed(results: Mapping[str, AcknowledgeStatus], what: str) -> None:
        failed = {a: r for a, r in results.items() if r is not AcknowledgeStatus.SUCCESS}
        if failed:
            raise AcknowledgeError(
                AcknowledgeStatus.INVALID_ACK_ID,
                f"{len(failed)} of {len(results)} ack ids did not apply to {what} (expired and delivered again, "
                "acked already, or unknown); the others did",
                failed,
            )

    def _acknowledge(self, rec: SubscriptionRecord, ack_ids: Sequence[str]) -> int:
        done = delivery.acknowledge(self._engine, rec, self._decode(rec, ack_ids), history=self._history, clock=self._clock)
        self._used(rec)
        return done

    def _modify_deadline(self, rec: SubscriptionRecord, ack_ids: Sequence[str], seconds: int) -> int:
        done = delivery.modify_deadline(
            self._engine, rec, self._decode(rec, ack_ids), seconds, clock=self._clock, history=self._history
        )
        self._used(rec)
        return done

    @refused_when_closed
    def acknowledge(self, request: Mapping[str, Any] | None = None, *, subscription: str | None = None, ack_ids: Sequence[str] | None = None) -> None:
        """Ack messages. Ack ids that expired, were superseded or are unknown are ignored; on a
        subscription with exactly-once delivery they raise ``AcknowledgeError`` (its
        ``failed`` maps each such ack id to INVALID_ACK_ID) after the others were acked."""
        f = fields("acknowledge", request, {"subscription", "ack_ids"}, subscription=subscription, ack_ids=ack_ids)
        name = required(f, "subscription", "acknowledge")
        ids = required(f, "ack_ids", "acknowledge")
        rec = self._sub(name)  # read once: its exactly-once setting decides the path
        if rec.enable_exactly_once_delivery:
            self._raise_failed(self._results(rec, ids, None), "acknowledge")
            return
        self._acknowledge(rec, ids)

    @refused_when_closed
    def modify_ack_deadline(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        subscription: str | None = None,
        ack_ids: Sequence[str] | None = None,
        ack_deadline_seconds: int | None = None,
    ) -> None:
        """Set the deadline of leased messages to now + seconds; 0 makes them available at once."""
        f = fields(
            "modify_ack_deadline", request, {"subscription", "ack_ids", "ack_deadline_seconds"},
            subscription=subscription, ack_ids=ack_ids, ack_deadline_seconds=ack_deadline_seconds,
        )
        name = required(f, "subscription", "modify_ack_deadline")
        seconds = required(f, "ack_deadline_seconds", "modify_ack_deadline")
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= MAX_ACK_DEADLINE:
            raise InvalidArgument("ack_deadline_seconds", f"must be an integer 0..{MAX_ACK_DEADLINE}, got {seconds!r}")
        ids = required(f, "ack_ids", "modify_ack_deadline")
        rec = self._sub(name)
        if rec.enable_exactly_once_delivery:  # as acknowledge: failed ids raise AcknowledgeError
            self._raise_failed(self._results(rec, ids, seconds), "modify_ack_deadline")
            return
        self._modify_deadline(rec, ids, seconds)

    # -- backlog ---------------------------------------------------------------------
    @refused_when_closed
    def get_backlog(self, subscription: str | None = None, *, request: Mapping[str, Any] | None = None) -> "backlog.BacklogStats":
        """Backlog figures of one subscription, computed now from the lease state.

        ``get_backlog(path)``, ``get_backlog(subscription=path)`` or ``get_backlog(request={"subscription": path})``.
        """
        f = fields("get_backlog", request, {"subscription"}, subscription=subscription)
        rec = self._sub(required(f, "subscription", "get_backlog"))
        return backlog.compute(self._engine, rec, self._clock())

    @refused_when_closed
    def refresh_backlog(self, *, request: Mapping[str, Any] | None = None) -> list["backlog.BacklogStats"]:
        """Compute every subscription's backlog and write it to the ``backlog`` table (push
        subscriptions keep the push job's counters, window and backoff). It has no fields:
        ``request`` may only be ``{}``."""
        fields("refresh_backlog", request, set())
        return backlog.refresh(self._engine, self._registry.subscriptions().values(), self._clock())

    # -- streaming pull -------------------------------------------------------------
    @refused_when_closed
    def subscribe(
        self,
        subscription: str,
        callback: Callable[[Message], object],
        flow_control: FlowControl | Sequence[Any] = (),
        scheduler: Executor | None = None,
        use_legacy_flow_control: bool = False,
        await_callbacks_on_shutdown: bool = False,
    ) -> "StreamingPullFuture":
        """Receive messages in the background; the callback gets each with ack()/nack().

        Leases are extended while callbacks run; ``future.cancel()`` stops and nacks what was held.
        A callback that raises gives its message back after a growing delay and resolves the
        future with its exception while the stream goes on (see ``futures``), as
        google-cloud-pubsub. ``await_callbacks_on_shutdown``: ``cancel()`` waits for running
        callbacks. ``use_legacy_flow_control`` is accepted for compatibility and changes
        nothing: flow control here is the client's own, there is no server side to it.
        """
        if not isinstance(use_legacy_flow_control, bool):
            raise InvalidArgument("use_legacy_flow_control", "must be a boolean")
        if not isinstance(await_callbacks_on_shutdown, bool):
            raise InvalidArgument("await_callbacks_on_shutdown", "must be a boolean")
        name = str(names.parse_subscription(subscription))
        if not callable(callback):
            raise InvalidArgument("callback", "must be callable")
        if not isinstance(flow_control, FlowControl):
            flow_control = settings_from_sequence(FlowControl, flow_control, "flow_control")
        rec = self._sub(name)
        if rec.detached:
            raise SubscriptionDetached(name)
        if rec.push_config.is_push:
            raise FailedPrecondition(f"{name} is a push subscription; subscribe needs an empty push endpoint")
        if rec.delta_config is not None:
            raise FailedPrecondition(export_pull_refused(name))
        manager = StreamingPullManager(
            _ClientLeaseOps(self, name), name, callback, flow_control, executor=scheduler, clock=self._clock,
            await_callbacks_on_shutdown=await_callbacks_on_shutdown,
            # Asked at each callback error (rare), so a policy set or cleared meanwhile counts.
            has_retry_policy=lambda: self._sub(name).retry_policy is not None,
        )
        with self._streams_lock:
            if self._closed:  # close() ran since the check on entry: start nothing
                raise ClientClosed("SubscriberClient.subscribe(): the client is closed; create a new one")
            self._streams = [m for m in self._streams if not m.closed]  # forget finished streams
            self._streams.append(manager)
        return manager.start()

    def close(self) -> None:
        """Stop every stream (nacking what it held, waiting for its threads), then refuse
        every further call. Idempotent. Acks from callbacks still running are carried out."""
        with self._streams_lock:
            self._closed = True
            streams, self._streams = self._streams, []
        for s in streams:
            s.close()

    def __enter__(self) -> "SubscriberClient":
        if self._closed:
            raise ClientClosed("a closed SubscriberClient cannot be used as a context manager")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ClientLeaseOps:
    """``LeaseOps`` for one subscription, over the client's own pull, ack and deadline calls
    (what a ``subscribe()`` stream needs of the delivery core; the manager never sees the client).

    Used by one stream: ``pull`` and ``wait_for_change`` from its consumer thread only."""

    def __init__(self, client: SubscriberClient, subscription: str) -> None:
        self._client = client
        self._subscription = subscription
        self._watch: tuple[LogWatcher, list[str]] | None = None
        self._seen: dict[str, int] = {}
        self._started = 0.0  # monotonic start of the last pull
        # The subscription's exactly-once setting as the last pull read it (each pull reads the
        # record anyway): the leaser and the sender ask it often, a registry read each.
        self._exactly_once: bool | None = None

    def pull(self, max_messages: int, lease_seconds: int) -> list[ReceivedMessage]:
        if self._watch is None:
            self._watch = self._client._log_watch()
        self._seen = self._watch[0].current(self._watch[1])
        self._started = time.monotonic()
        rec = self._client._sub(self._subscription)
        self._exactly_once = rec.enable_exactly_once_delivery
        return self._client._pull_record(rec, max_messages, lease_seconds)

    def acknowledge(self, ack_ids: Sequence[str]) -> None:
        self._client._acknowledge(self._client._sub(self._subscription), ack_ids)

    def modify_deadline(self, ack_ids: Sequence[str], seconds: int) -> None:
        self._client._modify_deadline(self._client._sub(self._subscription), ack_ids, seconds)

    def acknowledge_results(self, ack_ids: Sequence[str]) -> dict[str, AcknowledgeStatus]:
        return self._client._results(self._client._sub(self._subscription), ack_ids, None)

    def modify_deadline_results(self, ack_ids: Sequence[str], seconds: int) -> dict[str, AcknowledgeStatus]:
        return self._client._results(self._client._sub(self._subscription), ack_ids, seconds)

    def exactly_once(self) -> bool:
        if self._exactly_once is None:  # before the first pull
            self._exactly_once = self._client._sub(self._subscription).enable_exactly_once_delivery
        return self._exactly_once

    def wait_for_change(self, timeout: float, cancel: threading.Event) -> None:
        if self._watch is None:
            cancel.wait(timeout)
            return
        self._watch[0].wait_newer(self._seen, min(timeout, IDLE_RECHECK), cancel)
        cancel.wait(max(0.0, self._started + MIN_RECHECK - time.monotonic()))


from .futures import StreamingPullFuture  # noqa: E402  (for the annotation above)
