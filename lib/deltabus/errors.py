"""Exception hierarchy. Every error names the field and the rule it broke."""

from __future__ import annotations

import errno
from enum import Enum
from typing import Mapping


class DeltabusError(Exception):
    """Base class of every error deltabus raises on purpose."""


class InvalidArgument(DeltabusError, ValueError):
    """A request field breaks a rule. Nothing was written."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


class NotFound(DeltabusError, LookupError):
    """The named topic or subscription does not exist."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} not found: {name}")


class WarehouseNotFound(NotFound):
    """No deltabus tables at the warehouse path: a read never creates a warehouse (Pub/Sub
    answers NOT_FOUND for a project with nothing in it). Nothing was written."""

    def __init__(self, warehouse: str) -> None:
        super().__init__("warehouse", warehouse)
        self.args = (f"no warehouse at {warehouse}",)


class AlreadyExists(DeltabusError):
    """A topic or subscription with that name exists already."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} already exists: {name}")


class FailedPrecondition(DeltabusError):
    """The request is well formed but the system is not in a state to run it."""


class SubscriptionDetached(FailedPrecondition):
    """The subscription was detached from its topic (DetachSubscription): it still exists,
    but takes no pull, ack or deadline change and gets no messages. Nothing was written."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"{name} is detached from its topic: it delivers nothing and takes no acks")


class ClockUncertain(FailedPrecondition):
    """A lease was refused: this process knows the storage's time less well than its clock
    policy's ``max_uncertainty`` (``policy.clock_skew``), so others might judge the lease
    wrongly. Nothing was written; the call may be retried."""


class StorageFull(DeltabusError, OSError):
    """A write failed because the warehouse's filesystem is full (errno ENOSPC, issue 16).
    Tables stay consistent: a Delta commit either landed whole or not at all, so the call
    may be retried once space is freed (a retried publish may then be stored twice, as on
    any failed publish). ``filename`` is the table's path."""

    def __init__(self, what: str, path: str) -> None:
        super().__init__(errno.ENOSPC, "no space left on device", path)
        self.what = what

    @staticmethod
    def caused(exc: BaseException) -> bool:
        """Whether `exc` is a write that found the filesystem full. delta-rs reports ENOSPC as
        an OSError ("Generic LocalFileSystem error ... os error 28") or as a DeltaError
        ("Failed to parse parquet: External: ... No space left on device", from a MERGE)."""
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        text = str(exc)
        return "os error 28" in text or "No space left on device" in text

    def __str__(self) -> str:
        return f"{self.what}: no space left on device at {self.filename}; free space on that filesystem, then retry"


class Aborted(DeltabusError):
    """A commit kept conflicting with concurrent writers and was given up.

    Nothing of the aborted operation was written; it is safe to retry.
    """


class Cancelled(DeltabusError):
    """The operation was cancelled (for example a publish on a closed client)."""


class ClientClosed(Cancelled, RuntimeError):
    """A call on a client after ``close()``, or a publish after ``stop()``: make a new client.

    Also a ``RuntimeError``, as google-cloud-pubsub's "Cannot publish on a stopped publisher".
    """


class OrderingNotEnabled(DeltabusError, ValueError, RuntimeError):
    """``publish(..., ordering_key=...)`` on a publisher without message ordering enabled.

    google-cloud-pubsub's Python client raises ValueError here (its Java client an
    IllegalStateException): this is both a ValueError and a RuntimeError, so code written
    against either catches it.
    """


class OrderingKeyPaused(DeltabusError, RuntimeError):
    """A publish with an ordering key whose earlier publish failed (issue 13, as Pub/Sub's
    publisher client): the key stays paused, and its publishes fail at once without being
    written, until ``PublisherClient.resume_publish(topic, ordering_key)``."""

    def __init__(self, topic: str, ordering_key: str) -> None:
        self.topic = topic
        self.ordering_key = ordering_key
        super().__init__(
            f"ordering_key {ordering_key!r} on {topic}: paused after a failed publish; "
            "call resume_publish(topic, ordering_key) to publish with it again"
        )


class AcknowledgeStatus(str, Enum):
    """The outcome of an ack, nack or deadline change (google-cloud-pubsub's
    ``subscriber.exceptions.AcknowledgeStatus``). deltabus has no IAM, so it never answers
    PERMISSION_DENIED; FAILED_PRECONDITION is a detached subscription; OTHER a storage error."""

    SUCCESS = "SUCCESS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    INVALID_ACK_ID = "INVALID_ACK_ID"
    OTHER = "OTHER"


class AcknowledgeError(DeltabusError):
    """An ack, nack or deadline change on an exactly-once subscription did not apply
    (google-cloud-pubsub's ``AcknowledgeError``): ``error_code`` says why, ``info`` adds
    detail. INVALID_ACK_ID: the ack id names no current delivery (its lease ran out and the
    message went to someone else, it was acked already, or it is unknown).

    A unary ``acknowledge`` or ``modify_ack_deadline`` of several ids raises one, after
    applying the ids that could be, with ``failed`` mapping each ack id that did not apply
    to its status."""

    def __init__(self, error_code: AcknowledgeStatus, info: str | None = None, failed: Mapping[str, AcknowledgeStatus] | None = None) -> None:
        self.error_code = error_code
        self.info = info
        self.failed = dict(failed or {})
        super().__init__(f"{error_code.value}" + (f": {info}" if info else ""))


def export_pull_refused(name: str) -> str:
    """Why Pull/StreamingPull/subscribe are refused on a Delta export subscription: as with
    Pub/Sub's BigQuery and Cloud Storage subscriptions, only the export leases its messages
    (a puller holding a message the export appended but has not yet acked would land it twice)."""
    return (f"{name} is a Delta export subscription (delta_config is set); its messages are delivered "
            "only to its table, so it cannot be pulled from: clear delta_config to pull")
