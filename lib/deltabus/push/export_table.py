"""A Delta export subscription's target table (issue 17): its columns, and the idempotent append.

Columns are Pub/Sub's BigQuery subscription's (its documented metadata columns; Pub/Sub
writes no ordering key there, and neither does deltabus):

- without ``write_metadata``: ``data`` (binary);
- with it: ``subscription_name`` (string), ``message_id`` (string), ``publish_time``
  (timestamp, UTC), ``data`` (binary), ``attributes`` (map<string,string>).

``attributes`` is a map, not the JSON string BigQuery gets (BigQuery has no map type; Delta,
Spark and SQL engines read ``attributes['k']`` directly). A table created beforehand with a
string ``attributes`` column gets Pub/Sub's JSON text instead.

A missing table is created with that schema. An existing one must have a column of a
compatible type for each column written; a column it lacks is a schema mismatch, or is
dropped with ``drop_unknown_fields``. Its other columns must be nullable (they get null).

``append_once`` appends a batch with a Delta application transaction ``(app_id, version)``
and skips a batch whose version the table already records (delta-rs does not skip it by
itself: it reads ``transaction_version`` first and commits through the same handle).
Failures raise ``ExportError`` with a short ``reason`` for the backlog table: ``not found``,
``permission denied``, ``schema mismatch`` (Pub/Sub's BigQueryConfig states) or ``error``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import pyarrow as pa

from ..types import DeltaConfig, ReceivedMessage

__all__ = ["ExportError", "Reason", "schema_for", "rows_for", "append_once", "committed_version"]

Reason = Literal["not found", "permission denied", "schema mismatch", "error"]

STR_MAP = pa.map_(pa.string(), pa.string())
TS_UTC = pa.timestamp("us", tz="UTC")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ExportError(Exception):
    """The target table cannot take the batch; nothing was appended."""

    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason: Reason = reason
        self.detail = detail
        super().__init__(f"delta {reason}: {detail}")


def schema_for(config: DeltaConfig) -> pa.Schema:
    """The columns deltabus writes for `config` (and creates a missing table with)."""
    if not config.write_metadata:
        return pa.schema([pa.field("data", pa.binary())])
    return pa.schema([
        pa.field("subscription_name", pa.string()),
        pa.field("message_id", pa.string()),
        pa.field("publish_time", TS_UTC),
        pa.field("data", pa.binary()),
        pa.field("attributes", STR_MAP),
    ])


def rows_for(config: DeltaConfig, subscription: str, received: Sequence[ReceivedMessage]) -> pa.Table:
    """The batch's rows in ``schema_for(config)``, in the order received."""
    msgs = [r.message for r in received]
    cols: dict[str, list[Any]] = {"data": [m.data for m in msgs]}
    if config.write_metadata:
        cols = {
            "subscription_name": [subscription] * len(msgs),
            "message_id": [m.message_id for m in msgs],
            "publish_time": [m.publish_time for m in msgs],
            "data": cols["data"],
            "attributes": [list(m.attributes.items()) for m in msgs],
        }
    return pa.table(cols, schema=schema_for(config))


@dataclass(frozen=True, slots=True)
class _Fit:
    """How the batch's columns become the table's."""

    schema: pa.Schema  # the table's
    json_attributes: bool  # the table's attributes column is a string: Pub/Sub's JSON


def _fit(table_schema: pa.Schema, ours: pa.Schema, drop_unknown_fields: bool) -> _Fit:
    json_attributes = False
    for f in ours:
        if f.name not in table_schema.names:
            if drop_unknown_fields:
                continue
            raise ExportError("schema mismatch", f"the table has no column {f.name!r} (drop_unknown_fields drops it)")
        theirs = table_schema.field(f.name).type
        if f.name == "attributes" and (pa.types.is_string(theirs) or pa.types.is_large_string(theirs)):
            json_attributes = True
        elif not _compatible(f.type, theirs):
            raise ExportError("schema mismatch", f"column {f.name!r} is {theirs}, deltabus writes {f.type}")
    for f in table_schema:
        if f.name not in ours.names and not f.nullable:
            raise ExportError("schema mismatch", f"the table's column {f.name!r} is not nullable and deltabus does not write it")
    return _Fit(table_schema, json_attributes)


def _compatible(ours: pa.DataType, theirs: pa.DataType) -> bool:
    """Can a column of type `ours` be cast to the table's `theirs` without loss of meaning?"""
    t = pa.types
    families = (
        (t.is_binary, (t.is_binary, t.is_large_binary, t.is_binary_view)),
        (t.is_string, (t.is_string, t.is_large_string, t.is_string_view)),
        (t.is_timestamp, (t.is_timestamp,)),
        (t.is_map, (t.is_map,)),
    )
    if ours == theirs:
        return True
    if t.is_map(ours):  # map<string,string> only: any other key/value type would cast attribute values
        text = (t.is_string, t.is_large_string, t.is_string_view)
        return bool(t.is_map(theirs)) and all(any(ok(x) for ok in text) for x in (theirs.key_type, theirs.item_type))
    for is_ours, accepted in families:
        if is_ours(ours):
            return any(bool(ok(theirs)) for ok in accepted)
    return False


def _shaped(batch: pa.Table, fit: _Fit) -> pa.Table:
    cols = []
    for f in fit.schema:
        if f.name not in batch.column_names:
            cols.append(pa.nulls(batch.num_rows, f.type))
        elif f.name == "attributes" and fit.json_attributes:
            text = [json.dumps(dict(v), sort_keys=True, ensure_ascii=False) for v in batch["attributes"].to_pylist()]
            cols.append(pa.array(text, f.type))
        else:
            try:
                cols.append(batch[f.name].cast(f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                # Arrow's message quotes the values (message data): name the column and types only.
                raise ExportError("schema mismatch", f"column {f.name!r}: cannot write {batch.schema.field(f.name).type} "
                                                     f"as the table's {f.type} ({type(exc).__name__})") from None
    return pa.Table.from_arrays(cols, schema=fit.schema)


def _classify(exc: BaseException) -> ExportError:
    if isinstance(exc, ExportError):
        return exc
    # One line, without colour codes: delta-rs's messages span several and carry ANSI escapes.
    text = " ".join(_ANSI.sub("", f"{type(exc).__name__}: {exc}").replace("↳", "-").split())
    low = text.lower()
    denied = ("permission denied", "permissiondenied", "operation not permitted", "access denied", "forbidden")
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)):
        # A conversion of the batch: its message can quote message data, which must not reach logs or the backlog.
        return ExportError("schema mismatch", f"{type(exc).__name__} converting the batch to the table's schema")
    if isinstance(exc, PermissionError) or any(d in low for d in denied):
        return ExportError("permission denied", text[:500])
    if "schema" in low and ("mismatch" in low or "cast" in low):
        return ExportError("schema mismatch", text[:500])
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)) or "not a directory" in low or "no such file" in low:
        return ExportError("not found", text[:500])
    return ExportError("error", text[:500])


def _open(uri: str, schema: pa.Schema, storage_options: Mapping[str, str] | None) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    opts = dict(storage_options) if storage_options else None
    try:
        return DeltaTable(uri, storage_options=opts)
    except TableNotFoundError:
        # mode="ignore": another writer creating it at the same time is fine.
        return DeltaTable.create(uri, schema, mode="ignore", storage_options=opts)


CLAIM_SUB = "deltabus.export.subscription"
CLAIM_APP = "deltabus.export.app_id"
BATCH_NONCE = "deltabus.export.nonce"


def has_nonce(uri: str, nonce: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether a commit of the table at `uri` carries `nonce` (``append_once``'s): that
    batch was appended there. False when there is no such table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=dict(storage_options) if storage_options else None)
        return any(info.get(BATCH_NONCE) == nonce for info in table.history())
    except TableNotFoundError:
        return False
    except Exception as exc:  # noqa: BLE001 - any storage failure is the export's error
        raise _classify(exc) from exc


def claims(sub_uid: str, app_id: str) -> dict[str, str]:
    """The commitInfo metadata naming the job (`app_id`) that exports `sub_uid` to a table."""
    return {CLAIM_SUB: sub_uid, CLAIM_APP: app_id}


def claim(config: DeltaConfig, sub_uid: str, app_id: str, storage_options: Mapping[str, str] | None = None) -> str:
    """Claim the export of `sub_uid` into the config's table for `app_id` and return the owner:
    the app id of the earliest claim the table's log holds (commits are totally ordered, so
    two jobs claiming at once agree on one). A job that has no claim yet commits an empty one
    (its batches carry one too). ``ExportError`` when the table cannot be read or written."""
    from deltalake import CommitProperties, write_deltalake

    def owner(table: Any) -> tuple[str | None, bool]:
        mine, first = False, None
        for info in table.history():  # newest first: the last match is the earliest claim
            if info.get(CLAIM_SUB) == sub_uid and isinstance(info.get(CLAIM_APP), str):
                first = info[CLAIM_APP]
                mine = mine or first == app_id
        return first, mine

    try:
        schema = schema_for(config)
        table = _open(config.table, schema, storage_options)
        first, mine = owner(table)
        if not mine:
            empty = pa.Table.from_batches([], schema=pa.schema(table.schema().to_arrow()))
            write_deltalake(table, empty, mode="append",
                            commit_properties=CommitProperties(custom_metadata=claims(sub_uid, app_id)))
            first, mine = owner(_open(config.table, schema, storage_options))
        assert first is not None
        return first
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - classified for the backlog
        raise _classify(exc) from exc


def committed_version(uri: str, app_id: str, storage_options: Mapping[str, str] | None = None) -> int | None:
    """The latest batch the table records for `app_id` (None: none, or no table yet)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(uri, storage_options=dict(storage_options) if storage_options else None)
    except TableNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - any storage failure is the export's error
        raise _classify(exc) from exc
    return table.transaction_version(app_id)


def append_once(
    config: DeltaConfig, batch: pa.Table, app_id: str, version: int, storage_options: Mapping[str, str] | None = None,
    *, sub_uid: str = "", nonce: str = "",
) -> bool:
    """Append `batch` (``rows_for``) to the config's table as application transaction
    ``(app_id, version)``, creating the table if missing; False when the table already
    records that version (or a later one), so nothing was appended. ``ExportError`` otherwise."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    from ..storage.maintenance import post_commit_hooks

    try:
        table = _open(config.table, schema_for(config), storage_options)
        done = table.transaction_version(app_id)
        if done is not None and done >= version:
            return False
        fit = _fit(pa.schema(table.schema().to_arrow()), batch.schema, config.drop_unknown_fields)
        write_deltalake(
            table, _shaped(batch, fit), mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)],
                                               custom_metadata={**claims(sub_uid, app_id), BATCH_NONCE: nonce}),
            post_commithook_properties=post_commit_hooks(table.version()),  # a commit a batch: storage/maintenance.py
        )
        return True
    except Exception as exc:  # noqa: BLE001 - classified for the backlog; the caller keeps the messages
        raise _classify(exc) from exc
