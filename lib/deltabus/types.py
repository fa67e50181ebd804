"""Request and resource types, shaped like google-cloud-pubsub's ``types`` module."""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence, TypeVar

from . import names
from .errors import InvalidArgument
from .validation import check_push_endpoint

__all__ = [
    "PubsubMessage",
    "ReceivedMessage",
    "PullResponse",
    "Topic",
    "Subscription",
    "PushConfig",
    "OidcToken",
    "NoWrapper",
    "RetryPolicy",
    "DeltaConfig",
    "DeadLetterPolicy",
    "FlowControl",
    "BatchSettings",
    "PublisherOptions",
    "ListTopicsResponse",
    "ListSubscriptionsResponse",
    "ListTopicSubscriptionsResponse",
    "DetachSubscriptionResponse",
    "Snapshot",
    "ListSnapshotsResponse",
    "SeekResponse",
]

MIN_ACK_DEADLINE = 10
MAX_ACK_DEADLINE = 600
DEFAULT_ACK_DEADLINE = 10

# \Z, not $: `$` also matches before a final newline ("team\n" passed; issue 16's fuzzing).
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_\-]{0,62}\Z")
_LABEL_VALUE = re.compile(r"^[a-z0-9_\-]{0,63}\Z")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\Z")


@dataclass(frozen=True, slots=True)
class PubsubMessage:
    """A message: opaque data plus string attributes. Server-set fields are empty on publish."""

    data: bytes = b""
    attributes: Mapping[str, str] = field(default_factory=dict)
    message_id: str = ""
    publish_time: _dt.datetime | None = None
    ordering_key: str = ""

    @property
    def size(self) -> int:
        return len(self.data) + sum(len(k.encode()) + len(v.encode()) for k, v in self.attributes.items())


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    ack_id: str
    message: PubsubMessage
    delivery_attempt: int


@dataclass(frozen=True, slots=True)
class PullResponse:
    received_messages: list[ReceivedMessage] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic. ``message_retention_duration`` (seconds, 10 minutes..31 days; None: none)
    keeps every message, acked or not, that long, so that any subscription of the topic can
    seek back that far, even to before it was created (issue 15)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    message_retention_duration: float | None = None


@dataclass(frozen=True, slots=True)
class OidcToken:
    """Sign push requests with a JWT for this service account; audience defaults to the endpoint."""

    service_account_email: str = ""
    audience: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.service_account_email, str) or not _EMAIL.match(self.service_account_email):
            raise InvalidArgument(
                "push_config.oidc_token.service_account_email",
                f"must be an email address, got {self.service_account_email!r}",
            )
        if not isinstance(self.audience, str):
            raise InvalidArgument("push_config.oidc_token.audience", "must be a string")


@dataclass(frozen=True, slots=True)
class NoWrapper:
    """Push the raw data as the body; with write_metadata, metadata travels in headers."""

    write_metadata: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.write_metadata, bool):
            raise InvalidArgument("push_config.no_wrapper.write_metadata", "must be a boolean")


@dataclass(frozen=True, slots=True)
class PushConfig:
    """Where and how to push. An empty push_endpoint means a pull subscription."""

    push_endpoint: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)
    oidc_token: OidcToken | None = None
    no_wrapper: NoWrapper | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.push_endpoint, str):
            raise InvalidArgument("push_config.push_endpoint", "must be a string URL")
        if self.push_endpoint:
            check_push_endpoint(self.push_endpoint)
        if not isinstance(self.attributes, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.attributes.items()
        ):
            raise InvalidArgument("push_config.attributes", "must map strings to strings")
        if self.oidc_token is not None and not isinstance(self.oidc_token, OidcToken):
            raise InvalidArgument("push_config.oidc_token", "must be an OidcToken or a dict with service_account_email and audience")
        if self.no_wrapper is not None and not isinstance(self.no_wrapper, NoWrapper):
            raise InvalidArgument("push_config.no_wrapper", "must be a NoWrapper or a dict with write_metadata")
        if (self.oidc_token is not None or self.no_wrapper is not None) and not self.push_endpoint:
            raise InvalidArgument(
                "push_config", "oidc_token and no_wrapper need a push_endpoint (an empty endpoint means pull)"
            )

    @property
    def is_push(self) -> bool:
        return bool(self.push_endpoint)

    @classmethod
    def stored(
        cls, push_endpoint: str, attributes: Mapping[str, str], oidc_token: OidcToken | None, no_wrapper: NoWrapper | None
    ) -> "PushConfig":
        """A config read back from the registry, as it was stored.

        Rows written before the endpoint rule was tightened (a port of 99999, a space in the
        host) break today's rule. Refusing to read them would break every read of the
        warehouse, the push job's included, so they come back unchecked: the push job then
        reports that subscription's pushes as failing (``invalid url`` in the backlog) and
        ``update_subscription`` can set a valid endpoint."""
        try:
            return cls(push_endpoint, attributes, oidc_token, no_wrapper)
        except InvalidArgument:
            config = object.__new__(cls)
            for name, value in (("push_endpoint", push_endpoint), ("attributes", attributes),
                                ("oidc_token", oidc_token), ("no_wrapper", no_wrapper)):
                object.__setattr__(config, name, value)
            return config

    @classmethod
    def coerce(cls, value: "PushConfig | Mapping[str, Any] | None") -> "PushConfig":
        """Accept a PushConfig, a dict in Pub/Sub's JSON shape, or None (pull)."""
        if value is None:
            return cls()
        if isinstance(value, PushConfig):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument("push_config", f"must be a PushConfig or a dict, got {type(value).__name__}")
        known = {"push_endpoint", "attributes", "oidc_token", "no_wrapper"}
        unknown = set(value) - known
        if unknown:
            raise InvalidArgument("push_config", f"unknown fields {sorted(unknown, key=str)}; known: {sorted(known)}")
        oidc = value.get("oidc_token")
        if isinstance(oidc, Mapping):
            oidc = OidcToken(**_only(oidc, {"service_account_email", "audience"}, "push_config.oidc_token"))
        nowrap = value.get("no_wrapper")
        if isinstance(nowrap, Mapping):
            nowrap = NoWrapper(**_only(nowrap, {"write_metadata"}, "push_config.no_wrapper"))
        attributes = value.get("attributes") or {}
        return cls(
            push_endpoint=value.get("push_endpoint", "") or "",
            # Copied when a mapping; anything else is __post_init__'s InvalidArgument (dict("ab") raised ValueError).
            attributes=dict(attributes) if isinstance(attributes, Mapping) else attributes,
            oidc_token=oidc,
            no_wrapper=nowrap,
        )


def _only(value: Mapping[str, Any], known: set[str], field_name: str) -> dict[str, Any]:
    unknown = set(value) - known
    if unknown:
        raise InvalidArgument(field_name, f"unknown fields {sorted(unknown, key=str)}; known: {sorted(known)}")
    return dict(value)


def validate_labels(labels: object, field_name: str = "labels") -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise InvalidArgument(field_name, "must map strings to strings")
    if len(labels) > 64:
        raise InvalidArgument(field_name, f"at most 64 labels, got {len(labels)}")
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_KEY.match(k):
            raise InvalidArgument(f"{field_name}[{k!r}]", "keys are 1..63 lower-case letters, digits, '_' or '-', starting with a letter")
        if not isinstance(v, str) or not _LABEL_VALUE.match(v):
            raise InvalidArgument(f"{field_name}[{k!r}]", "values are 0..63 lower-case letters, digits, '_' or '-'")
    return dict(labels)


def validate_ack_deadline(seconds: object, field_name: str = "ack_deadline_seconds") -> int:
    """10..600 seconds; 0 (or None) means the default of 10 seconds, as in Pub/Sub."""
    if isinstance(seconds, bool) or (seconds is not None and not isinstance(seconds, int)):
        raise InvalidArgument(field_name, f"must be an integer number of seconds, got {seconds!r}")
    if seconds is None or seconds == 0:
        return DEFAULT_ACK_DEADLINE
    if not isinstance(seconds, int):
        raise InvalidArgument(field_name, f"must be an integer number of seconds, got {seconds!r}")
    if not MIN_ACK_DEADLINE <= seconds <= MAX_ACK_DEADLINE:
        raise InvalidArgument(field_name, f"must be between {MIN_ACK_DEADLINE} and {MAX_ACK_DEADLINE} seconds, got {seconds}")
    return seconds


# -- delivery policies (issue 13) -------------------------------------------------------------
MIN_BACKOFF = 0.0
MAX_BACKOFF = 600.0
DEFAULT_MINIMUM_BACKOFF = 10.0
DEFAULT_MAXIMUM_BACKOFF = 600.0
MIN_DELIVERY_ATTEMPTS = 5
MAX_DELIVERY_ATTEMPTS = 100
DEFAULT_MAX_DELIVERY_ATTEMPTS = 5


def duration_seconds(value: object, field_name: str) -> float:
    """A duration as seconds (a float), from what a google-cloud-pubsub user may pass: a number
    of seconds, a ``datetime.timedelta`` (what proto-plus hands back for a Duration), Pub/Sub's
    ``{"seconds": n, "nanos": m}`` (a dict or an object with those attributes, as a protobuf
    Duration), or its JSON form ``"12.5s"``. Raises InvalidArgument naming ``field_name``."""
    seconds: float
    if isinstance(value, bool):
        raise InvalidArgument(field_name, f"must be a duration in seconds, got {value!r}")
    try:
        seconds = _duration_float(value, field_name)
    except OverflowError:  # an int too large for a float (10**400)
        raise InvalidArgument(field_name, f"must be a finite number of seconds, got {value!r}") from None
    if not math.isfinite(seconds):
        raise InvalidArgument(field_name, f"must be a finite number of seconds, got {value!r}")
    return seconds


def _duration_float(value: object, field_name: str) -> float:
    seconds: float
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text[:-1] if text.endswith("s") else text)
        except ValueError:
            raise InvalidArgument(field_name, f"must be a duration such as 10, 10.5 or '10s', got {value!r}") from None
    elif isinstance(value, Mapping) or (hasattr(value, "seconds") and hasattr(value, "nanos")):
        parts = dict(value) if isinstance(value, Mapping) else {"seconds": getattr(value, "seconds"), "nanos": getattr(value, "nanos")}
        unknown = set(parts) - {"seconds", "nanos"}
        if unknown:
            raise InvalidArgument(field_name, f"a duration has seconds and nanos, got unknown fields {sorted(unknown, key=str)}")
        whole, nanos = parts.get("seconds", 0) or 0, parts.get("nanos", 0) or 0
        if isinstance(whole, bool) or not isinstance(whole, int) or isinstance(nanos, bool) or not isinstance(nanos, int):
            raise InvalidArgument(field_name, f"a duration's seconds and nanos are integers, got {value!r}")
        seconds = whole + nanos / 1e9
    else:
        raise InvalidArgument(
            field_name, f"must be a duration (seconds, timedelta or {{'seconds': n, 'nanos': m}}), got {type(value).__name__}"
        )
    return seconds


def _show(seconds: float) -> str:
    return str(int(seconds)) if seconds == int(seconds) else str(seconds)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a nacked or expired message waits before it is due again (Pub/Sub's
    ``RetryPolicy``): an exponential delay between ``minimum_backoff`` and
    ``maximum_backoff`` seconds, growing with the message's delivery attempts
    (``policy/retry.py`` has the formula). Both 0..600 s, minimum <= maximum; a field not
    given takes Pub/Sub's default (10 s, 600 s). Durations normalise to float seconds:
    ``RetryPolicy(timedelta(seconds=5))`` equals ``RetryPolicy(5.0)``."""

    minimum_backoff: float = DEFAULT_MINIMUM_BACKOFF
    maximum_backoff: float = DEFAULT_MAXIMUM_BACKOFF

    def __post_init__(self) -> None:
        for name in ("minimum_backoff", "maximum_backoff"):
            path = f"retry_policy.{name}"
            seconds = duration_seconds(getattr(self, name), path)
            if not MIN_BACKOFF <= seconds <= MAX_BACKOFF:
                raise InvalidArgument(path, f"must be 0..600 seconds, got {_show(seconds)}")
            object.__setattr__(self, name, seconds)
        if self.minimum_backoff > self.maximum_backoff:
            raise InvalidArgument(
                "retry_policy.minimum_backoff",
                f"must not exceed maximum_backoff ({_show(self.maximum_backoff)}), got {_show(self.minimum_backoff)}",
            )

    @classmethod
    def coerce(cls, value: object, field_name: str = "retry_policy") -> "RetryPolicy | None":
        """A RetryPolicy, a dict with minimum_backoff/maximum_backoff (either may be missing or
        null: the default), or None (no policy)."""
        if value is None or isinstance(value, RetryPolicy):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument(field_name, f"must be a RetryPolicy, a dict or None, got {type(value).__name__}")
        given = {k: v for k, v in _only(value, {"minimum_backoff", "maximum_backoff"}, field_name).items() if v is not None}
        if "minimum_backoff" not in given and "maximum_backoff" in given:
            # Only the maximum was given: an error must name it, not the minimum its caller never set.
            path = f"{field_name}.maximum_backoff"
            maximum = duration_seconds(given["maximum_backoff"], path)
            if MIN_BACKOFF <= maximum < DEFAULT_MINIMUM_BACKOFF:
                raise InvalidArgument(path, f"must not be below the minimum backoff ({_show(DEFAULT_MINIMUM_BACKOFF)} s, its default "
                                            f"when it is not given), got {_show(maximum)}")
        return cls(**given)


# -- Delta export (issue 17) ----------------------------------------------------------------------
MAX_DELTA_TABLE_CHARS = 4096
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


@dataclass(frozen=True, slots=True)
class DeltaConfig:
    """Export the subscription's messages to a Delta table (the counterpart of Pub/Sub's
    ``BigQueryConfig``): the push job appends each message once, then acks it.

    ``table``: an absolute path or a URI (``file:///...``, ``s3://bucket/t``); created when
    missing. ``write_metadata``: add Pub/Sub's metadata columns (``subscription_name``,
    ``message_id``, ``publish_time``, ``attributes``) to ``data``. ``drop_unknown_fields``:
    a column deltabus writes that an existing table lacks is dropped instead of failing the
    export as a schema mismatch. A push subscription cannot carry one (``push_config``
    with an endpoint); a pull subscription with one is still pullable, as in Pub/Sub."""

    table: str
    write_metadata: bool = False
    drop_unknown_fields: bool = False

    def __post_init__(self) -> None:
        path = "delta_config.table"
        if not isinstance(self.table, str) or not self.table.strip():
            raise InvalidArgument(path, "must be a non-empty path or URI of a Delta table")
        if len(self.table) > MAX_DELTA_TABLE_CHARS:
            raise InvalidArgument(path, f"must be at most {MAX_DELTA_TABLE_CHARS} characters, got {len(self.table)}")
        if any(ch.isspace() or ord(ch) < 32 for ch in self.table):
            raise InvalidArgument(path, "must not contain whitespace or control characters")
        if not (self.table.startswith("/") or _URI.match(self.table)):
            raise InvalidArgument(path, f"must be an absolute path or a URI (scheme://...), got {self.table!r}")
        for name in ("write_metadata", "drop_unknown_fields"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(f"delta_config.{name}", "must be a boolean")

    @classmethod
    def coerce(cls, value: object, field_name: str = "delta_config") -> "DeltaConfig | None":
        """A DeltaConfig, a dict with ``table`` (and optionally ``write_metadata``,
        ``drop_unknown_fields``), or None / a dict with an empty table (no export)."""
        if value is None or isinstance(value, DeltaConfig):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument(field_name, f"must be a DeltaConfig, a dict or None, got {type(value).__name__}")
        given = {k: v for k, v in _only(value, {"table", "write_metadata", "drop_unknown_fields"}, field_name).items()
                 if v is not None}
        if not given.get("table"):
            if any(given.get(k) for k in ("write_metadata", "drop_unknown_fields")):
                raise InvalidArgument(f"{field_name}.table", "is required with write_metadata or drop_unknown_fields")
            return None
        return cls(**given)


# -- expiration (issue 15) ------------------------------------------------------------------------
DAY = 86_400.0
DEFAULT_EXPIRATION_TTL = 31 * DAY
MIN_EXPIRATION_TTL = DAY
MAX_EXPIRATION_TTL = 365 * DAY


@dataclass(frozen=True, slots=True)
class ExpirationPolicy:
    """When an unused subscription is deleted (Pub/Sub's ``ExpirationPolicy``): after ``ttl``
    seconds without a pull, an ack, a deadline change or a push, ``deltabus maintenance``
    deletes it. ``ttl`` is 1..365 days; None means never. A subscription created without a
    policy gets Pub/Sub's default, 31 days; ``ExpirationPolicy(ttl=None)`` (or ``{}``) is
    "never expires", as an empty policy is in Pub/Sub. Durations normalise to float seconds."""

    ttl: float | None = DEFAULT_EXPIRATION_TTL

    def __post_init__(self) -> None:
        if self.ttl is None:
            return
        seconds = duration_seconds(self.ttl, "expiration_policy.ttl")
        if not MIN_EXPIRATION_TTL <= seconds <= MAX_EXPIRATION_TTL:
            raise InvalidArgument("expiration_policy.ttl", f"must be 1..365 days ({_show(MIN_EXPIRATION_TTL)}..{_show(MAX_EXPIRATION_TTL)} "
                                  f"seconds) or unset (never), got {_show(seconds)} seconds")
        object.__setattr__(self, "ttl", seconds)

    @classmethod
    def coerce(cls, value: object, field_name: str = "expiration_policy") -> "ExpirationPolicy":
        """An ExpirationPolicy, a dict with ``ttl`` (missing or null: never), or None (the
        default policy, 31 days: the field was not given)."""
        if value is None:
            return cls()
        if isinstance(value, ExpirationPolicy):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument(field_name, f"must be an ExpirationPolicy, a dict or None, got {type(value).__name__}")
        return cls(ttl=_only(value, {"ttl"}, field_name).get("ttl"))


# -- retention, seek and snapshots (issue 15) -----------------------------------------------------
MIN_RETENTION = 600.0
MAX_SUBSCRIPTION_RETENTION = 7 * DAY
DEFAULT_SUBSCRIPTION_RETENTION = 7 * DAY
MAX_TOPIC_RETENTION = 31 * DAY
# A snapshot lives at most this long, and less when its oldest unacked message is older:
# it ends when that message would be 7 days old (Pub/Sub's rule).
SNAPSHOT_LIFETIME = 7 * DAY


def validate_subscription_retention(value: object, field_name: str = "message_retention_duration") -> float:
    """A subscription's message_retention_duration in seconds: 10 minutes..7 days; None
    (not given) is the default, 7 days."""
    if value is None:
        return DEFAULT_SUBSCRIPTION_RETENTION
    seconds = duration_seconds(value, field_name)
    if not MIN_RETENTION <= seconds <= MAX_SUBSCRIPTION_RETENTION:
        raise InvalidArgument(field_name, f"must be 10 minutes..7 days (600..604800 seconds), got {_show(seconds)} seconds")
    return seconds


def validate_topic_retention(value: object, field_name: str = "message_retention_duration") -> float | None:
    """A topic's message_retention_duration in seconds: 10 minutes..31 days, or None (or 0,
    as an unset protobuf Duration reads): no topic retention."""
    if value is None:
        return None
    seconds = duration_seconds(value, field_name)
    if seconds == 0:
        return None
    if not MIN_RETENTION <= seconds <= MAX_TOPIC_RETENTION:
        raise InvalidArgument(field_name, f"must be 10 minutes..31 days (600..2678400 seconds) or unset, got {_show(seconds)} seconds")
    return seconds


def timestamp_seconds(value: object, field_name: str) -> float:
    """A point in time as seconds since the epoch, from what a google-cloud-pubsub user may
    pass: a ``datetime`` (naive ones are UTC, as proto-plus reads them), a number of seconds,
    an RFC 3339 string (``"2026-11-26T12:00:00Z"``), or a protobuf ``Timestamp`` (``seconds``
    and ``nanos``, an object or a dict). Raises InvalidArgument naming ``field_name``.

    The time must lie in 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z (a protobuf Timestamp's
    range): a finite time outside it (1e300) has no datetime or Arrow timestamp, and a seek
    to it raised OverflowError (issue 16's fuzzing)."""
    if isinstance(value, bool):
        raise InvalidArgument(field_name, f"must be a time, got {value!r}")
    try:
        seconds = _timestamp_float(value, field_name)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise InvalidArgument(field_name, f"must be a finite time, got {value!r}")
    if not MIN_TIME <= seconds <= MAX_TIME:
        raise InvalidArgument(field_name, f"must be a time from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z, got {value!r}")
    return seconds


MIN_TIME = -62_135_596_800.0  # 0001-01-01T00:00:00Z
MAX_TIME = 253_402_300_799.0  # 9999-12-31T23:59:59Z


def _timestamp_float(value: object, field_name: str) -> float:
    seconds: float
    if isinstance(value, _dt.datetime):
        when = value if value.tzinfo is not None else value.replace(tzinfo=_dt.timezone.utc)
        return when.timestamp()
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            parsed = _dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
        except ValueError:
            raise InvalidArgument(field_name, f"must be an RFC 3339 time such as 2026-11-26T12:00:00Z, got {value!r}") from None
        return _timestamp_float(parsed, field_name)
    elif isinstance(value, Mapping) or (hasattr(value, "seconds") and hasattr(value, "nanos")):
        parts = dict(value) if isinstance(value, Mapping) else {"seconds": getattr(value, "seconds"), "nanos": getattr(value, "nanos")}
        whole, nanos = parts.get("seconds", 0) or 0, parts.get("nanos", 0) or 0
        if set(parts) - {"seconds", "nanos"} or not isinstance(whole, int) or not isinstance(nanos, int):
            raise InvalidArgument(field_name, f"a timestamp has integer seconds and nanos, got {value!r}")
        seconds = whole + nanos / 1e9
    else:
        raise InvalidArgument(field_name, f"must be a datetime, seconds since the epoch or an RFC 3339 string, got {type(value).__name__}")
    return seconds


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot of a subscription (Pub/Sub's ``Snapshot``): the messages unacked in it when
    the snapshot was taken, and every message of ``topic`` published after. Seeking a
    subscription of the same topic to it makes exactly those unacked. ``expire_time``: when
    ``deltabus maintenance`` deletes it (``SNAPSHOT_LIFETIME``)."""

    name: str
    topic: str
    expire_time: _dt.datetime | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListSnapshotsResponse:
    """One page of ``list_snapshots``."""

    snapshots: list[Snapshot] = field(default_factory=list)
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class SeekResponse:
    """What ``seek`` returns: nothing, as Pub/Sub's empty response."""


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    """Where a message goes once it has been delivered ``max_delivery_attempts`` times without
    an ack (Pub/Sub's ``DeadLetterPolicy``). ``dead_letter_topic`` is a full topic path;
    ``max_delivery_attempts`` is 5..100, and 0 means the default 5, as in Pub/Sub."""

    dead_letter_topic: str
    max_delivery_attempts: int = DEFAULT_MAX_DELIVERY_ATTEMPTS

    def __post_init__(self) -> None:
        topic = str(names.parse_topic(self.dead_letter_topic, "dead_letter_policy.dead_letter_topic"))
        object.__setattr__(self, "dead_letter_topic", topic)
        attempts = self.max_delivery_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise InvalidArgument("dead_letter_policy.max_delivery_attempts", f"must be an integer, got {attempts!r}")
        if attempts == 0:
            attempts = DEFAULT_MAX_DELIVERY_ATTEMPTS
        if not MIN_DELIVERY_ATTEMPTS <= attempts <= MAX_DELIVERY_ATTEMPTS:
            raise InvalidArgument("dead_letter_policy.max_delivery_attempts", f"must be 5..100, got {attempts}")
        object.__setattr__(self, "max_delivery_attempts", attempts)

    @classmethod
    def coerce(cls, value: object, field_name: str = "dead_letter_policy") -> "DeadLetterPolicy | None":
        """A DeadLetterPolicy, a dict with dead_letter_topic (required) and
        max_delivery_attempts (missing, null or 0: 5), or None (no policy)."""
        if value is None or isinstance(value, DeadLetterPolicy):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument(field_name, f"must be a DeadLetterPolicy, a dict or None, got {type(value).__name__}")
        given = _only(value, {"dead_letter_topic", "max_delivery_attempts"}, field_name)
        if not given.get("dead_letter_topic"):
            raise InvalidArgument(f"{field_name}.dead_letter_topic", "is required (a topic path 'projects/P/topics/T')")
        return cls(given["dead_letter_topic"], given.get("max_delivery_attempts") or 0)


MAX_FILTER_BYTES = 256


@dataclass(frozen=True, slots=True)
class Subscription:
    """A subscription's settings, as google-cloud-pubsub's ``types.Subscription``.

    The delivery policies (issue 13): ``retry_policy`` (None: a nacked or expired message is
    due again at once), ``dead_letter_policy`` (None: never dead-lettered), ``filter`` ("":
    every message) and ``enable_message_ordering``. The first two may change through
    ``update_subscription``; the filter and ordering are fixed at creation, as in Pub/Sub.
    ``detached`` (issue 14) is True once ``PublisherClient.detach_subscription`` ran: the
    subscription stays, with no backlog, and refuses pull, acks and deadline changes.
    ``expiration_policy`` (issue 15): unused that long, maintenance deletes it.
    ``message_retention_duration`` and ``retain_acked_messages`` (issue 15): how far back
    ``seek`` can replay, and whether acked messages come back too.
    ``delta_config`` (issue 17): the push job appends its messages to that Delta table.
    ``subscription_fields.COLUMNS`` declares every field's rules; a test checks this class
    against it."""

    name: str
    topic: str
    push_config: PushConfig = field(default_factory=PushConfig)
    ack_deadline_seconds: int = DEFAULT_ACK_DEADLINE
    labels: Mapping[str, str] = field(default_factory=dict)
    enable_message_ordering: bool = False
    retry_policy: RetryPolicy | None = None
    dead_letter_policy: DeadLetterPolicy | None = None
    filter: str = ""
    detached: bool = False  # set only by detach_subscription (output only, as in Pub/Sub)
    expiration_policy: ExpirationPolicy = field(default_factory=ExpirationPolicy)
    # Issue 15: how long unacked messages (and acked ones, with retain_acked_messages) are
    # kept for seek; seconds, 10 minutes..7 days.
    message_retention_duration: float = DEFAULT_SUBSCRIPTION_RETENTION
    retain_acked_messages: bool = False
    # Issue 15: acks and deadline changes report whether they applied (pull only).
    enable_exactly_once_delivery: bool = False
    # Issue 17: export to a Delta table (None: no export).
    delta_config: DeltaConfig | None = None

    @classmethod
    def coerce(cls, value: "Subscription | Mapping[str, Any]") -> "Subscription":
        if isinstance(value, Subscription):
            return value
        if not isinstance(value, Mapping):
            raise InvalidArgument("subscription", f"must be a Subscription or a dict, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(value) - known
        if unknown:
            raise InvalidArgument("subscription", f"unknown fields {sorted(unknown, key=str)}; known: {sorted(known)}")
        data = dict(value)
        if "push_config" in data:
            data["push_config"] = PushConfig.coerce(data["push_config"])
        if "retry_policy" in data:
            data["retry_policy"] = RetryPolicy.coerce(data["retry_policy"])
        if "dead_letter_policy" in data:
            data["dead_letter_policy"] = DeadLetterPolicy.coerce(data["dead_letter_policy"])
        if "delta_config" in data:
            data["delta_config"] = DeltaConfig.coerce(data["delta_config"])
        return cls(**data)

    def with_changes(self, **changes: Any) -> "Subscription":
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class FlowControl:
    """Limits on what a streaming pull holds at once, and how leases are extended."""

    max_bytes: int = 100 * 1024 * 1024
    max_messages: int = 1000
    max_lease_duration: float = 3600.0
    min_duration_per_lease_extension: float = 0.0
    max_duration_per_lease_extension: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_messages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgument(f"flow_control.{name}", f"must be an integer >= 1, got {v!r}")
        for name in ("max_lease_duration", "min_duration_per_lease_extension", "max_duration_per_lease_extension"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InvalidArgument(f"flow_control.{name}", f"must be a number >= 0, got {v!r}")
        if self.min_duration_per_lease_extension and not 10 <= self.min_duration_per_lease_extension <= 600:
            raise InvalidArgument("flow_control.min_duration_per_lease_extension", "must be 0 (unset) or 10..600 seconds")
        if self.max_duration_per_lease_extension and not 10 <= self.max_duration_per_lease_extension <= 600:
            raise InvalidArgument("flow_control.max_duration_per_lease_extension", "must be 0 (unset) or 10..600 seconds")
        if (
            self.min_duration_per_lease_extension
            and self.max_duration_per_lease_extension
            and self.min_duration_per_lease_extension > self.max_duration_per_lease_extension
        ):
            raise InvalidArgument(
                "flow_control.min_duration_per_lease_extension", "must not exceed max_duration_per_lease_extension"
            )


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How PublisherClient.publish groups messages into one Delta commit."""

    max_bytes: int = 1_000_000
    max_latency: float = 0.01
    max_messages: int = 100

    def __post_init__(self) -> None:
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise InvalidArgument("batch_settings.max_bytes", f"must be an integer >= 1, got {self.max_bytes!r}")
        if isinstance(self.max_messages, bool) or not isinstance(self.max_messages, int) or not 1 <= self.max_messages <= 100_000:
            raise InvalidArgument("batch_settings.max_messages", f"must be an integer 1..100000, got {self.max_messages!r}")
        # Finite: inf made the batcher's wait raise OverflowError, nan made no batch ever due (both hung publishes).
        if isinstance(self.max_latency, bool) or not isinstance(self.max_latency, (int, float)) or not 0 <= self.max_latency < math.inf:
            raise InvalidArgument("batch_settings.max_latency", f"must be a finite number of seconds >= 0, got {self.max_latency!r}")


_Settings = TypeVar("_Settings")


def settings_from_sequence(cls: type[_Settings], value: object, field_name: str) -> _Settings:
    """``cls(*value)``: google-cloud-pubsub takes a settings type (FlowControl,
    PublisherOptions) or a tuple of its fields. InvalidArgument naming ``field_name`` when
    `value` is no sequence of at most that many fields (``FlowControl(*5)`` raised TypeError)."""
    n = len(fields(cls))  # type: ignore[arg-type]  # a dataclass type, which mypy cannot see through the TypeVar
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or len(value) > n:
        raise InvalidArgument(
            field_name, f"must be a deltabus.types.{cls.__name__} or a sequence of at most {n} of its fields, got {type(value).__name__}"
        )
    return cls(*value)


@dataclass(frozen=True, slots=True)
class PublisherOptions:
    """PublisherClient options, as google-cloud-pubsub's ``types.PublisherOptions``.

    ``enable_message_ordering``: ``publish()`` accepts an ``ordering_key`` only with it, as
    Pub/Sub's client (which then publishes each key's messages in sequence).
    """

    enable_message_ordering: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.enable_message_ordering, bool):
            raise InvalidArgument(
                "publisher_options.enable_message_ordering", f"must be a boolean, got {self.enable_message_ordering!r}"
            )


@dataclass(frozen=True, slots=True)
class ListTopicsResponse:
    """One page of ``list_topics``; an empty ``next_page_token`` means the last page."""

    topics: list[Topic] = field(default_factory=list)
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class ListSubscriptionsResponse:
    """One page of ``list_subscriptions``."""

    subscriptions: list[Subscription] = field(default_factory=list)
    next_page_token: str = ""


@dataclass(frozen=True, slots=True)
class DetachSubscriptionResponse:
    """What ``detach_subscription`` returns: nothing, as Pub/Sub's empty response."""


@dataclass(frozen=True, slots=True)
class ListTopicSubscriptionsResponse:
    """One page of ``list_topic_subscriptions``: subscription names."""

    subscriptions: list[str] = field(default_factory=list)
    next_page_token: str = ""
