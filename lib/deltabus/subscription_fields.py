"""The one declaration of a subscription's fields.

Every column of the ``subscriptions`` table is declared once in ``COLUMNS``, in table
order: its Arrow type, default, validator, whether it is public (on ``types.Subscription``),
settable by ``create_subscription``, updatable through ``update_subscription``'s mask, how
it is stored, its command-line flag, and the schema version of the table that added it.
Derived from it (nowhere else lists the fields):

- the ``subscriptions`` TableSpec's schema and its versions (``storage/tables.py``);
- the registry's row <-> record conversion and ``SubscriptionRecord.public()``;
- create/update validation and the updatable set of ``SubscriberClient``;
- the ``subscriptions create/update`` flags of the CLI and what ``subscriptions get`` shows;
- the columns of the ``subscriptions`` SQL view.

``types.Subscription`` is written out by hand, because users and type checkers read it;
tests/unit/test_subscription_fields.py checks it against ``PUBLIC``. ``SubscriptionRecord``
subclasses it with the internal columns, so it needs no line of its own.
``create_subscription``'s keyword arguments are a fixed few (as google-cloud-pubsub's);
every settable field is taken in ``request``.

Adding a field is one ``SubscriptionField`` appended to ``COLUMNS`` with ``since`` the
schema version that adds it (the current one plus one; fields of one release share it),
one line in ``types.Subscription``, and the field's own logic. New columns go at the end,
nullable, so an older table migrates by adding them (``ensure_tables``); rows written
before read null, which loads as the field's default.

This module is a leaf of data: it imports only ``errors``, ``names``, ``timestamps``,
``_call_args`` and ``types`` (none of which import storage or anything above it), so the
storage layer's table catalogue derives the table from it without depending on domain code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

import pyarrow as pa

from . import names
from ._call_args import required
from .errors import InvalidArgument
from .policy import filter_syntax
from .timestamps import TS
from .types import (
    MAX_FILTER_BYTES,
    DeadLetterPolicy,
    DeltaConfig,
    ExpirationPolicy,
    NoWrapper,
    OidcToken,
    PushConfig,
    RetryPolicy,
    Subscription,
    validate_ack_deadline,
    validate_labels,
    validate_subscription_retention,
)

__all__ = [
    "CliFlag",
    "SubscriptionField",
    "COLUMNS",
    "BY_NAME",
    "PUBLIC",
    "SETTABLE",
    "UPDATABLE",
    "WITH_FLAG",
    "VIEW_COLUMNS",
    "schema_layers",
    "store",
    "load",
    "public_values",
    "create_settings",
    "update_changes",
]

STR_MAP = pa.map_(pa.string(), pa.string())

Check = Callable[[Any], Any]
"""A caller's extra check of one clean value (the client's "http needs allow_http"): returns
the value to keep, or raises InvalidArgument."""


@dataclass(frozen=True, slots=True)
class CliFlag:
    """How ``deltabus subscriptions create/update`` takes a field.

    ``collect``: ``"one"`` is a single value parsed by ``parse`` (argparse's ``type``);
    ``"pairs"`` is a repeatable ``KEY=VALUE`` flag giving a dict; ``"switch"`` takes no
    value and sets the (boolean) field to True (on update it has a ``--no-`` form too). On update, giving the flag puts the field
    in the update mask."""

    flag: str
    metavar: str
    create_help: str | None = None
    update_help: str | None = None
    collect: Literal["one", "pairs", "switch"] = "one"
    parse: Callable[[str], Any] | None = None

    def __post_init__(self) -> None:
        if not self.flag.startswith("--"):
            raise ValueError(f"CliFlag {self.flag!r}: a flag starts with --")
        if self.collect in ("pairs", "switch") and self.parse is not None:
            raise ValueError(f"CliFlag {self.flag}: {self.collect} flags take no parse function")

    @property
    def dest(self) -> str:
        """The argparse attribute the flag lands on: ``--ack-deadline`` -> ``ack_deadline``."""
        return self.flag[2:].replace("-", "_")


@dataclass(frozen=True, slots=True)
class SubscriptionField:
    """One column of the subscriptions table, and what the API and CLI do with it.

    - ``public``: a field of ``types.Subscription`` (returned by get/list). Internal columns
      (``public=False``) are set by the registry only.
    - ``settable``: ``create_subscription`` takes it in ``request`` (public only);
      ``required`` ones have no default (``name``, ``topic``). Its keyword arguments are a
      fixed few of these (today's six), as google-cloud-pubsub flattens only some fields:
      a new field need not become one.
    - ``updatable``: ``update_subscription``'s ``update_mask`` may name it.
    - ``default``: the value when create is not given it, and when a row written before the
      column existed holds null.
    - ``validate(value, path)``: the clean value, or ``InvalidArgument`` naming ``path``
      (or a sub-field of it) and the rule. It also gets ``None`` when a request dict gives
      the field as null.
    - ``to_row``/``from_row``: the stored (Arrow-ready) form and back; identity when None.
    - ``since``: the version of the subscriptions table's schema that added the column.
      Columns after version 1 are nullable (existing rows read them as null).
    """

    name: str
    arrow_type: pa.DataType
    since: int = 1
    public: bool = True
    settable: bool = True
    updatable: bool = False
    required: bool = False
    nullable: bool = True
    default: Callable[[], Any] | None = None
    validate: Callable[[Any, str], Any] | None = None
    to_row: Callable[[Any], Any] | None = None
    from_row: Callable[[Any], Any] | None = None
    cli: CliFlag | None = None

    def __post_init__(self) -> None:
        where = f"subscription field {self.name!r}"
        if self.since < 1:
            raise ValueError(f"{where}: since is a schema version >= 1")
        if self.since > 1 and not self.nullable:
            raise ValueError(f"{where}: a column added after version 1 must be nullable (old rows hold null)")
        if self.settable and not self.public:
            raise ValueError(f"{where}: only public fields are settable")
        if self.updatable and not self.settable:
            raise ValueError(f"{where}: an updatable field must be settable")
        if self.settable and self.validate is None:
            raise ValueError(f"{where}: a settable field needs a validator")
        if self.public and not self.required and self.default is None:
            raise ValueError(f"{where}: a public field needs a default (or required=True)")
        if self.required and self.default is not None:
            raise ValueError(f"{where}: a required field has no default")
        if self.cli is not None and not self.settable:
            raise ValueError(f"{where}: only settable fields have a CLI flag")

    @property
    def arrow_field(self) -> pa.Field:
        return pa.field(self.name, self.arrow_type, nullable=self.nullable)

    def store(self, value: Any) -> Any:
        """The value as the table stores it."""
        return value if self.to_row is None or value is None else self.to_row(value)

    def load(self, cell: Any) -> Any:
        """A stored value as the record holds it; null reads as the default (a row older than
        the column, or an internal column not set)."""
        if cell is None:
            return None if self.default is None else self.default()
        return cell if self.from_row is None else self.from_row(cell)

    def check(self, value: Any, path: str) -> Any:
        """The validated value of a request; raises InvalidArgument naming ``path``."""
        if self.validate is None:  # pragma: no cover - __post_init__ rules it out for settable fields
            raise InvalidArgument(path, "cannot be set")
        return self.validate(value, path)


# -- validators and stored forms ---------------------------------------------------------------
def _subscription_name(value: Any, path: str) -> str:
    return str(names.parse_subscription(value, path))


def _topic_name(value: Any, path: str) -> str:
    return str(names.parse_topic(value, path))


def _push_config(value: Any, path: str) -> PushConfig:
    # PushConfig names its own sub-fields (push_config.push_endpoint, ...), as it always has,
    # whether it came in a create request or under update_subscription's "subscription".
    return PushConfig.coerce(value)


def _boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(path, "must be a boolean")
    return value


def _push_row(config: PushConfig) -> dict[str, Any]:
    return {
        "push_endpoint": config.push_endpoint,
        "attributes": list(config.attributes.items()),
        "oidc_token": None
        if config.oidc_token is None
        else {"service_account_email": config.oidc_token.service_account_email, "audience": config.oidc_token.audience},
        "no_wrapper": None if config.no_wrapper is None else {"write_metadata": config.no_wrapper.write_metadata},
    }


def _push_from_row(row: Mapping[str, Any]) -> PushConfig:
    oidc = row.get("oidc_token")
    nowrap = row.get("no_wrapper")
    # .stored: a row written under an older endpoint rule still reads back (see PushConfig.stored).
    return PushConfig.stored(
        push_endpoint=row.get("push_endpoint") or "",
        attributes=dict(row.get("attributes") or []),
        oidc_token=OidcToken(**oidc) if oidc else None,
        no_wrapper=NoWrapper(**nowrap) if nowrap else None,
    )


def _map_row(value: Mapping[str, str]) -> list[tuple[str, str]]:
    return list(value.items())


def _map_from_row(cell: Any) -> dict[str, str]:
    return dict(cell)


def _retry_policy(value: Any, path: str) -> RetryPolicy | None:
    # None (or a mask path with the field unset) means no policy: redelivery at once.
    # RetryPolicy names its own sub-fields (retry_policy.minimum_backoff), as PushConfig does.
    return RetryPolicy.coerce(value, path)


def _retry_row(policy: RetryPolicy) -> dict[str, float]:
    return {"minimum_backoff": policy.minimum_backoff, "maximum_backoff": policy.maximum_backoff}


def _retry_from_row(row: Mapping[str, Any]) -> RetryPolicy:
    return RetryPolicy(row["minimum_backoff"], row["maximum_backoff"])


def _dead_letter_policy(value: Any, path: str) -> DeadLetterPolicy | None:
    # Only the shape here; that the topic exists is the client's check at create/update time.
    return DeadLetterPolicy.coerce(value, path)


def _dead_letter_row(policy: DeadLetterPolicy) -> dict[str, Any]:
    return {"dead_letter_topic": policy.dead_letter_topic, "max_delivery_attempts": policy.max_delivery_attempts}


def _dead_letter_from_row(row: Mapping[str, Any]) -> DeadLetterPolicy:
    return DeadLetterPolicy(row["dead_letter_topic"], int(row["max_delivery_attempts"]))


def _filter(value: Any, path: str) -> str:
    """The subscription's filter: "" (or None) is no filter; at most 256 bytes of UTF-8, and
    Pub/Sub's filter syntax (``policy.filter_syntax``: errors name the 1-based position)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidArgument(path, f"must be a string, got {type(value).__name__}")
    size = len(value.encode("utf-8"))
    if size > MAX_FILTER_BYTES:
        raise InvalidArgument(path, f"must be at most {MAX_FILTER_BYTES} bytes, got {size}")
    if value:
        filter_syntax.parse(value, path)
    return value


def _delta_config(value: Any, path: str) -> DeltaConfig | None:
    # None (or a mask path with the field unset, or an empty table): no export.
    # DeltaConfig names its own sub-fields (delta_config.table), as PushConfig does.
    return DeltaConfig.coerce(value, path)


def _delta_row(config: DeltaConfig) -> dict[str, Any]:
    return {"table": config.table, "write_metadata": config.write_metadata,
            "drop_unknown_fields": config.drop_unknown_fields}


def _delta_from_row(row: Mapping[str, Any]) -> DeltaConfig:
    return DeltaConfig(row["table"], bool(row.get("write_metadata")), bool(row.get("drop_unknown_fields")))


def _expiration_policy(value: Any, path: str) -> ExpirationPolicy:
    # None: the field was not given (or a mask path with it unset): Pub/Sub's default policy.
    return ExpirationPolicy.coerce(value, path)


def _expiration_row(policy: ExpirationPolicy) -> dict[str, Any]:
    return {"ttl": policy.ttl}


def _expiration_from_row(row: Mapping[str, Any]) -> ExpirationPolicy:
    return ExpirationPolicy(row["ttl"])


def parse_duration(text: str) -> float:
    """A CLI duration: seconds, or a number with s/m/h/d (``10m``, ``36h``, ``7d``). The
    range is the field's validator's to check; a value that is no duration is argparse's error."""
    import argparse

    value = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
    scale = units.get(value[-1:])
    try:
        return float(value[:-1] if scale is not None else value) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a duration such as 7d, 36h, 10m or 600, got {text!r}") from None


def _retention(value: Any, path: str) -> float:
    return validate_subscription_retention(value, path)


def parse_ttl(text: str) -> dict[str, float | None]:
    """The CLI's --ttl as the field's request value: ``never``, or a duration
    (``parse_duration``). The range is the field's validator's to check (its error names
    ``expiration_policy.ttl``)."""
    import argparse

    if text.strip().lower() == "never":
        return {"ttl": None}
    try:
        return {"ttl": parse_duration(text)}
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be 'never' or a duration such as 31d, 36h or 86400, got {text!r}") from None


DELTA_CONFIG = pa.struct(
    [pa.field("table", pa.string()), pa.field("write_metadata", pa.bool_()), pa.field("drop_unknown_fields", pa.bool_())]
)
EXPIRATION_POLICY = pa.struct([pa.field("ttl", pa.float64())])
RETRY_POLICY = pa.struct([pa.field("minimum_backoff", pa.float64()), pa.field("maximum_backoff", pa.float64())])
DEAD_LETTER_POLICY = pa.struct(
    [pa.field("dead_letter_topic", pa.string()), pa.field("max_delivery_attempts", pa.int32())]
)

PUSH_CONFIG = pa.struct(
    [
        pa.field("push_endpoint", pa.string()),
        pa.field("attributes", STR_MAP),
        pa.field(
            "oidc_token",
            pa.struct([pa.field("service_account_email", pa.string()), pa.field("audience", pa.string())]),
        ),
        pa.field("no_wrapper", pa.struct([pa.field("write_metadata", pa.bool_())])),
    ]
)


# -- the declaration ------------------------------------------------------------------------------
# In table order. Version 1 is round 1's layout (the order tables already on disk have); a
# later version's columns are appended after it, so a migrated table and a new one agree.
COLUMNS: tuple[SubscriptionField, ...] = (
    SubscriptionField("name", pa.string(), nullable=False, required=True, validate=_subscription_name),
    SubscriptionField("sub_uid", pa.string(), nullable=False, public=False, settable=False),
    SubscriptionField("topic", pa.string(), nullable=False, required=True, validate=_topic_name),
    SubscriptionField("topic_uid", pa.string(), nullable=False, public=False, settable=False),
    SubscriptionField(
        "push_config", PUSH_CONFIG, updatable=True, default=PushConfig, validate=_push_config,
        to_row=_push_row, from_row=_push_from_row,
        # Several flags with rules between them (--push-endpoint, --oidc-*, --no-wrapper,
        # --pull): the CLI builds this one itself (cli._push_config).
    ),
    SubscriptionField(
        "ack_deadline_seconds", pa.int32(), updatable=True, default=lambda: validate_ack_deadline(None),
        validate=validate_ack_deadline, from_row=int,
        cli=CliFlag("--ack-deadline", "SECONDS", create_help="10..600 (default 10)", update_help="10..600", parse=int),
    ),
    SubscriptionField(
        "labels", STR_MAP, updatable=True, default=dict, validate=validate_labels,
        to_row=_map_row, from_row=_map_from_row,
        cli=CliFlag("--label", "KEY=VALUE", update_help="replace the labels", collect="pairs"),
    ),
    SubscriptionField(
        "enable_message_ordering", pa.bool_(), default=lambda: False, validate=_boolean, from_row=bool,
        cli=CliFlag("--enable-message-ordering", "", create_help="deliver each ordering key's messages in order (fixed at creation)",
                    collect="switch"),
    ),
    # messages-table version at creation: the subscription point.
    SubscriptionField("start_version", pa.int64(), public=False, settable=False, from_row=int),
    SubscriptionField("create_time", TS, public=False, settable=False),
    SubscriptionField("update_time", TS, public=False, settable=False),
    # Version 2 (issue 13): the delivery policies. Mutability as Pub/Sub's UpdateSubscription:
    # the retry and dead-letter policies may change; the filter (like enable_message_ordering)
    # is fixed at creation. A null policy column is "no policy"; a null filter reads as "".
    # The CLI builds the two policies from several flags itself (cli._policy_flags).
    SubscriptionField(
        "retry_policy", RETRY_POLICY, since=2, updatable=True, default=lambda: None, validate=_retry_policy,
        to_row=_retry_row, from_row=_retry_from_row,
    ),
    SubscriptionField(
        "dead_letter_policy", DEAD_LETTER_POLICY, since=2, updatable=True, default=lambda: None,
        validate=_dead_letter_policy, to_row=_dead_letter_row, from_row=_dead_letter_from_row,
    ),
    SubscriptionField(
        "filter", pa.string(), since=2, default=str, validate=_filter,
        cli=CliFlag("--filter", "EXPRESSION", create_help="Pub/Sub filter over attributes (at most 256 bytes; fixed at creation)"),
    ),
    # Version 3 (issue 14, DetachSubscription): set by detaching only (Registry.detach_subscription),
    # never by create or update; it is never cleared. A detached subscription keeps its
    # settings, gets no messages and takes no pull, ack or deadline change (delivery.hooks).
    # A null (a row older than the column) reads as False.
    SubscriptionField("detached", pa.bool_(), since=3, settable=False, default=lambda: False, from_row=bool),
    # Version 4 (issue 15): expiration. A null policy column (a row older than it) reads as
    # the default policy (31 days); a stored policy with a null ttl is "never".
    SubscriptionField(
        "expiration_policy", EXPIRATION_POLICY, since=4, updatable=True, default=ExpirationPolicy,
        validate=_expiration_policy, to_row=_expiration_row, from_row=_expiration_from_row,
        cli=CliFlag("--ttl", "DURATION", create_help="delete it after this long unused: 1d..365d, or never (default 31d)",
                    update_help="1d..365d, or never", parse=parse_ttl),
    ),
    # When the subscription was last used (pull, ack, deadline change, push), recorded at
    # most once an hour per process (``activity.ActivityRecorder``); null: not since created.
    SubscriptionField("last_active", TS, since=4, public=False, settable=False),
    # Version 5 (issue 15): retention, for seek. Unacked messages older than the retention
    # are dropped by maintenance; with retain_acked_messages, acked ones stay that long too
    # and a seek back in time delivers them again. A null (an older row) reads as the default.
    SubscriptionField(
        "message_retention_duration", pa.float64(), since=5, updatable=True,
        default=lambda: validate_subscription_retention(None), validate=_retention,
        cli=CliFlag("--retention", "DURATION", create_help="keep messages this long for seek: 10m..7d (default 7d)",
                    update_help="10m..7d", parse=parse_duration),
    ),
    SubscriptionField(
        "retain_acked_messages", pa.bool_(), since=5, updatable=True, default=lambda: False, validate=_boolean,
        from_row=bool,
        cli=CliFlag("--retain-acked", "", create_help="keep acked messages too, so a seek back in time replays them",
                    update_help="keep acked messages too (--no-retain-acked: no longer)", collect="switch"),
    ),
    # Exactly-once delivery (issue 15): acks and deadline changes report whether they applied,
    # and a successful ack is final. Pull only: a push subscription cannot enable it
    # (checked with push_config, ``check_exactly_once``). A null reads as False.
    SubscriptionField(
        "enable_exactly_once_delivery", pa.bool_(), since=5, updatable=True, default=lambda: False, validate=_boolean,
        from_row=bool,
        cli=CliFlag("--exactly-once", "", create_help="exactly-once delivery: acks report whether they applied (pull only)",
                    update_help="exactly-once delivery (--no-exactly-once: off)", collect="switch"),
    ),
    # Version 6 (issue 17): Delta export, the counterpart of Pub/Sub's BigQuery subscriptions.
    # Not with a push endpoint (``check_delivery_kind``). A null is no export. The CLI builds
    # it from its --delta-* flags itself (cli._delta_config).
    SubscriptionField(
        "delta_config", DELTA_CONFIG, since=6, updatable=True, default=lambda: None, validate=_delta_config,
        to_row=_delta_row, from_row=_delta_from_row,
    ),
)

BY_NAME: dict[str, SubscriptionField] = {c.name: c for c in COLUMNS}
PUBLIC: tuple[SubscriptionField, ...] = tuple(c for c in COLUMNS if c.public)
SETTABLE: tuple[SubscriptionField, ...] = tuple(c for c in COLUMNS if c.settable)
UPDATABLE: frozenset[str] = frozenset(c.name for c in COLUMNS if c.updatable)
WITH_FLAG: tuple[SubscriptionField, ...] = tuple(c for c in COLUMNS if c.cli is not None)
# What the `subscriptions` SQL view shows besides name and topic (which it derives itself).
VIEW_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in COLUMNS if c.public and c.name not in ("name", "topic")
) + ("create_time", "update_time")


def _check_declaration() -> None:
    if len(BY_NAME) != len(COLUMNS):
        raise ValueError("subscription fields: a name is declared twice")
    versions = [c.since for c in COLUMNS]
    if versions != sorted(versions) or versions[0] != 1:
        raise ValueError("subscription fields: columns are in version order (a new version's go at the end)")
    if sorted(set(versions)) != list(range(1, max(versions) + 1)):
        raise ValueError("subscription fields: schema versions are consecutive")


_check_declaration()


def schema_layers() -> tuple[tuple[pa.Field, ...], ...]:
    """The columns each schema version of the subscriptions table added (index 0: version 1)."""
    top = max(c.since for c in COLUMNS)
    return tuple(tuple(c.arrow_field for c in COLUMNS if c.since == v) for v in range(1, top + 1))


# -- rows and records -----------------------------------------------------------------------------
def store(values: Mapping[str, Any]) -> dict[str, Any]:
    """A table row from the record's values (every column)."""
    return {c.name: c.store(values[c.name]) for c in COLUMNS}


def load(row: Mapping[str, Any]) -> dict[str, Any]:
    """The record's values from a table row; a column the row lacks (an older table) is null."""
    return {c.name: c.load(row.get(c.name)) for c in COLUMNS}


def public_values(values: Any) -> dict[str, Any]:
    """The public fields of a record (anything with those attributes), for ``types.Subscription``.
    Dicts are copied, so a caller changing what it got cannot change a cached record."""
    out = {c.name: getattr(values, c.name) for c in PUBLIC}
    return {k: dict(v) if isinstance(v, dict) else v for k, v in out.items()}


def check_exactly_once(values: Any, path: str = "enable_exactly_once_delivery") -> None:
    """Refuse exactly-once delivery on a push or Delta export subscription (Pub/Sub's rule: it
    is a pull feature). `values` has ``push_config``, ``delta_config`` and
    ``enable_exactly_once_delivery``."""
    if values.enable_exactly_once_delivery and values.push_config.is_push:
        raise InvalidArgument(path, "a push subscription cannot enable exactly-once delivery (pull subscriptions only)")
    if values.enable_exactly_once_delivery and values.delta_config is not None:
        # As Pub/Sub's export subscriptions; the export is exactly-once into its table anyway.
        raise InvalidArgument(path, "a Delta export subscription cannot enable exactly-once delivery (pull subscriptions only)")


def check_delivery_kind(values: Any, path: str = "delta_config") -> None:
    """Refuse a push endpoint together with a Delta export (Pub/Sub's rule: a subscription
    is push, BigQuery or pull). `values` has ``push_config`` and ``delta_config``."""
    if values.delta_config is not None and values.push_config.is_push:
        raise InvalidArgument(path, "a subscription is either push (push_config.push_endpoint) or a Delta export "
                                    "(delta_config.table), not both")


# -- requests ----------------------------------------------------------------------------------
def create_settings(
    given: Mapping[str, Any], checks: Mapping[str, Check] | None = None, *, method: str = "create_subscription"
) -> Subscription:
    """The validated settings of a create request (the fields given, by name).

    Fields are checked in declaration order and the first bad one raises InvalidArgument
    naming it; a field not given takes its default. ``checks`` adds a caller's rule to a
    field, run right after its validator."""
    checks = checks or {}
    values: dict[str, Any] = {}
    for fld in SETTABLE:
        if fld.required:
            value = fld.check(required(given, fld.name, method), fld.name)
        elif fld.name in given:
            value = fld.check(given[fld.name], fld.name)
        else:
            value = fld.default() if fld.default is not None else None
        if fld.name in checks:
            value = checks[fld.name](value)
        values[fld.name] = value
    return Subscription(**values)


def update_changes(
    given: Mapping[str, Any], paths: list[str], checks: Mapping[str, Check] | None = None
) -> dict[str, Any]:
    """The validated new values of an update: ``given`` maps each path of the mask to the
    value sent (``None`` when the subscription did not carry it). Errors name
    ``subscription.<field>``. The mask must already be checked against ``UPDATABLE``."""
    checks = checks or {}
    changes: dict[str, Any] = {}
    for fld in COLUMNS:
        if fld.name not in paths:
            continue
        value = fld.check(given.get(fld.name), f"subscription.{fld.name}")
        if fld.name in checks:
            value = checks[fld.name](value)
        changes[fld.name] = value
    return changes
