"""A subscription as a Spark structured-streaming source (issue 17, part 1).

    df = (spark.readStream.format("deltabus").option("warehouse", W)
          .option("subscription", "projects/p/subscriptions/s").option("maxMessagesPerTrigger", 10000).load())

Columns: message_id, data (binary), attributes (map), ordering_key ("" when none), publish_time,
delivery_attempt, subscription. Design: docs/design/issue-17-streaming-source.md.

How it stays exactly-once into a sink that writes each Spark batch id at most once
(``idempotent_delta_sink``): ``latestOffset()`` leases through the ordinary pull (filters,
ordering, dead-letter policy apply), writes the rows, payloads included, to an immutable
*manifest* ``<warehouse>/_streams/<sub_uid>/<consumer>/m-<n>/`` and records it in
``state.json`` before it returns the offset ``{"batch": n}``; ``read()`` reads only the
manifest named by a batch's end offset, so a replay reads the same rows. The messages are
acked when Spark commits the batch (``commit``, and again at the next planning or restart
if a crash lost it); a thread extends the leases meanwhile. A message this source leases
again while one of its batches holds it is not emitted a second time (``policy.stream_ledger``).

Only the driver's stream runner process writes the ledger; executors read parquet files.
One running query per (subscription, consumer). The ledger lives on a local (or mounted)
warehouse. ``Trigger.AvailableNow`` runs one batch of at most maxMessagesPerTrigger.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import socket
import threading
import time
import uuid
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

import pyarrow as pa

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..errors import InvalidArgument
from ..policy import stream_ledger as policy

log = logging.getLogger(__name__)

NAME = "deltabus"
MAX_PULL = 10_000  # one pull's most (the pull path's own limit)
HEARTBEAT_SECONDS = 2.0  # the owner heartbeat's longest interval (heartbeat_interval)
UNSETTLED_SECONDS = 7 * 24 * 3600.0  # how long an unapplied ack keeps a message out (the longest retention)

SCHEMA = StructType(
    [
        StructField("message_id", StringType(), False),
        StructField("data", BinaryType()),
        StructField("attributes", MapType(StringType(), StringType())),
        StructField("ordering_key", StringType()),
        StructField("publish_time", TimestampType()),
        StructField("delivery_attempt", IntegerType()),
        StructField("subscription", StringType()),
    ]
)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("data", pa.binary()),
        pa.field("attributes", pa.map_(pa.string(), pa.string())),
        pa.field("ordering_key", pa.string()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
        pa.field("delivery_attempt", pa.int32()),
        pa.field("subscription", pa.string()),
    ]
)
# A manifest's columns: the schema's (less subscription) plus what the ack needs.
MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("seq", pa.int64()),
        pa.field("message_id", pa.string(), nullable=False),
        pa.field("message_version", pa.int64()),
        pa.field("ack_id", pa.string()),
        pa.field("delivery_attempt", pa.int32()),
        pa.field("data", pa.binary()),
        pa.field("attributes", pa.map_(pa.string(), pa.string())),
        pa.field("ordering_key", pa.string()),
        pa.field("publish_time", pa.timestamp("us", tz="UTC")),
    ]
)

Offset = dict[str, Any]


# -- options ---------------------------------------------------------------------------------
def _int_option(options: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidArgument(name, f"must be an integer {lo}..{hi}, got {raw!r}") from None
    if not lo <= value <= hi:
        raise InvalidArgument(name, f"must be an integer {lo}..{hi}, got {raw!r}")
    return value


def _float_option(options: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise InvalidArgument(name, f"must be a number of seconds {lo:g}..{hi:g}, got {raw!r}") from None
    if not (lo <= value <= hi) or math.isnan(value):
        raise InvalidArgument(name, f"must be a number of seconds {lo:g}..{hi:g}, got {raw!r}")
    return value


OPTION_NAMES = ("warehouse", "subscription", "consumer", "maxMessagesPerTrigger", "leaseSeconds", "maxLeaseDuration",
                "pullWaitSeconds", "rowsPerPartition", "ownerTimeout", "deliveryHistory", "path")


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """The source's options, checked (``from_options`` parses Spark's string options,
    case-insensitively as Spark hands them over). lease_seconds None: the subscription's
    ack deadline (at least 60 with exactly-once)."""

    warehouse: str
    subscription: str
    consumer: str = "default"
    max_messages_per_trigger: int = 1000
    lease_seconds: int | None = None
    max_lease_duration: float = 3600.0
    pull_wait_seconds: float = 1.0
    rows_per_partition: int = 5000
    owner_timeout: float = 10.0
    storage_options: tuple[tuple[str, str], ...] = ()
    # Record the delivery history of this stream's leases, acks and nacks (README "Delivery history").
    delivery_history: bool = True

    def __post_init__(self) -> None:
        from ..names import parse_subscription

        if not isinstance(self.warehouse, str) or not self.warehouse:
            raise InvalidArgument("warehouse", "is required: the warehouse's path or URI")
        if "://" in self.warehouse and not self.warehouse.startswith("file://"):
            raise InvalidArgument("warehouse", "must be a local or mounted path for the stream source (its ledger is files)")
        if not isinstance(self.subscription, str) or not self.subscription:
            raise InvalidArgument("subscription", "is required: projects/<project>/subscriptions/<name>")
        parse_subscription(self.subscription, "subscription")
        if not isinstance(self.consumer, str) or not self.consumer or len(self.consumer) > 64 or not all(
            c.isalnum() or c in "-_" for c in self.consumer
        ):
            raise InvalidArgument("consumer", f"must be 1..64 letters, digits, '-' or '_', got {self.consumer!r}")
        if not 1 <= self.max_messages_per_trigger <= 100_000:
            raise InvalidArgument("maxMessagesPerTrigger", f"must be an integer 1..100000, got {self.max_messages_per_trigger!r}")
        if self.lease_seconds is not None and not 10 <= self.lease_seconds <= 600:
            raise InvalidArgument("leaseSeconds", f"must be an integer 10..600, got {self.lease_seconds!r}")
        if not 10 <= self.max_lease_duration <= 7 * 24 * 3600:
            raise InvalidArgument("maxLeaseDuration", f"must be a number of seconds 10..604800, got {self.max_lease_duration!r}")
        if not 0 <= self.pull_wait_seconds <= 60:
            raise InvalidArgument("pullWaitSeconds", f"must be a number of seconds 0..60, got {self.pull_wait_seconds!r}")
        if not 1 <= self.rows_per_partition <= 1_000_000:
            raise InvalidArgument("rowsPerPartition", f"must be an integer 1..1000000, got {self.rows_per_partition!r}")
        if not 3 <= self.owner_timeout <= 600:
            raise InvalidArgument("ownerTimeout", f"must be a number of seconds 3..600, got {self.owner_timeout!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "StreamOptions":
        lower = {str(k).lower(): v for k, v in options.items()}
        known = {o.lower(): o for o in OPTION_NAMES}
        # Named as the user spelled it (Spark itself hands the keys over lowercased, so through
        # Spark it is the lowercased spelling), with the option it most likely meant.
        unknown = sorted(str(k) for k in options if str(k).lower() not in known and not str(k).lower().startswith("storage."))
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0].lower(), list(known), n=1, cutoff=0.75)
            hint = f"did you mean {known[close[0]]}? " if close else ""
            raise InvalidArgument(unknown[0], f"is not an option of the deltabus source ({hint}options: "
                                              f"{', '.join(o for o in OPTION_NAMES if o != 'path')}, storage.<key>)")
        lease = lower.get("leaseseconds")
        raw_history = str(lower.get("deliveryhistory", "true")).strip().lower()
        if raw_history not in ("true", "false"):
            raise InvalidArgument("deliveryHistory", f"must be true or false, got {lower.get('deliveryhistory')!r}")
        return cls(
            warehouse=str(lower.get("warehouse") or lower.get("path") or ""),
            subscription=str(lower.get("subscription") or ""),
            consumer=str(lower.get("consumer", "default")),
            max_messages_per_trigger=_named_int(lower, "maxmessagespertrigger", "maxMessagesPerTrigger", 1, 100_000, 1000),
            lease_seconds=None if lease is None else _named_int(lower, "leaseseconds", "leaseSeconds", 10, 600, 0),
            max_lease_duration=_named_float(lower, "maxleaseduration", "maxLeaseDuration", 3600.0, 10, 7 * 24 * 3600),
            pull_wait_seconds=_named_float(lower, "pullwaitseconds", "pullWaitSeconds", 1.0, 0, 60),
            rows_per_partition=_named_int(lower, "rowsperpartition", "rowsPerPartition", 1, 1_000_000, 5000),
            owner_timeout=_named_float(lower, "ownertimeout", "ownerTimeout", 10.0, 3, 600),
            storage_options=tuple(sorted((k.removeprefix("storage."), str(v)) for k, v in lower.items() if k.startswith("storage."))),
            delivery_history=raw_history == "true",
        )

    @property
    def ledger_root(self) -> str:
        root = self.warehouse.removeprefix("file://")
        return os.path.join(os.path.abspath(root), "_streams")


def _named_int(lower: Mapping[str, str], key: str, name: str, lo: int, hi: int, default: int) -> int:
    return default if key not in lower else _int_option({name: lower[key]}, name, default, lo, hi)


def _named_float(lower: Mapping[str, str], key: str, name: str, default: float, lo: float, hi: float) -> float:
    if key not in lower:
        return default
    return _float_option({name: lower[key]}, name, default, lo, hi)


# -- manifests (driver writes, executors read) ---------------------------------------------------
class ManifestPart(InputPartition):
    """One parquet file of a batch's manifest; read on an executor, nothing else needed."""

    def __init__(self, path: str, subscription: str) -> None:
        self.path = path
        self.subscription = subscription


def read_part(part: ManifestPart) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    table = pq.read_table(part.path)
    n = table.num_rows
    out = pa.table(
        {
            "message_id": table["message_id"],
            "data": table["data"],
            "attributes": table["attributes"],
            "ordering_key": table["ordering_key"],
            "publish_time": table["publish_time"],
            "delivery_attempt": table["delivery_attempt"],
            "subscription": pa.array([part.subscription] * n, pa.string()),
        }
    ).cast(ARROW_SCHEMA)
    yield from out.to_batches(max_chunksize=65536)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unguarded() -> ContextManager[None]:
    return nullcontext()


def _write_json(path: str, doc: Mapping[str, Any], guard: Callable[[], ContextManager[None]] = _unguarded) -> None:
    """Replace `path` with `doc` atomically: a temporary file written and fsynced first, then
    renamed inside `guard()` (OwnerLock.guard: the owner check and the rename under one flock,
    so the rename cannot land after another run took the ledger). A refused guard leaves
    `path` as it was and no temporary file."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        with guard():
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    _fsync_dir(os.path.dirname(path))


def write_manifest(directory: str, n: int, table: pa.Table, rows_per_partition: int,
                   guard: Callable[[], ContextManager[None]] = _unguarded) -> None:
    """Manifest `n` (immutable): parts written under a temporary name, fsynced, renamed at once
    inside `guard()` (as _write_json's). An empty table makes an empty manifest (a batch that
    only lets Spark commit the last)."""
    import pyarrow.parquet as pq

    final = os.path.join(directory, f"m-{n}")
    tmp = os.path.join(directory, f".m-{n}.tmp-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    if table.num_rows:
        count = max(1, math.ceil(table.num_rows / rows_per_partition))
        which = pa.array(policy.parts_of(table["ordering_key"].to_pylist(), count), pa.int32())
        import pyarrow.compute as pc

        for k in range(count):
            piece = table.filter(pc.equal(which, k))
            if piece.num_rows == 0:
                continue
            path = os.path.join(tmp, f"part-{k:05d}.parquet")
            pq.write_table(piece, path)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(tmp)
    try:
        with guard():
            if os.path.exists(final):  # written by a run that died before recording it: never offered to Spark
                shutil.rmtree(final)
            os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only when the guard refused
    _fsync_dir(directory)


def manifest_files(directory: str, n: int) -> list[str]:
    path = os.path.join(directory, f"m-{n}")
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"the manifest of batch {n} is missing ({path}): the stream's ledger was deleted or changed; "
            "use a new checkpoint location or another consumer"
        )
    return [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".parquet")]


# -- the per-process runtime (the driver's stream runner) ------------------------------------------
class _Runtime:
    """Everything with state: the engine, the ledger, the live batches' leases, the leaser
    thread. One per (warehouse, subscription, consumer) in a process, made on first use."""

    def __init__(self, opts: StreamOptions) -> None:
        from ..registry import Registry
        from ..storage import open_engine
        from ..storage.clock import StorageClock, resolve_clock, wall

        from ..delivery.history import OFF, RECORD

        self.opts = opts
        self.history = RECORD if opts.delivery_history else OFF
        self.clock = resolve_clock(None, None)
        self.engine = open_engine(opts.warehouse, engine="delta-rs", storage_options=dict(opts.storage_options) or None, create=False)
        if isinstance(self.clock, StorageClock):
            self.clock.attach(self.engine)
        self.registry = Registry(self.engine, clock=wall(self.clock))
        from ..activity import ActivityRecorder

        # Pulls count as use for the subscription's expiration policy, as a client's do.
        self.activity = ActivityRecorder(self.registry, wall(self.clock))
        rec = self.record()
        self.sub_uid = rec.sub_uid
        self.dir = os.path.join(opts.ledger_root, rec.sub_uid, opts.consumer)
        os.makedirs(self.dir, exist_ok=True)
        self.run = uuid.uuid4().hex
        self.owner = OwnerLock(self.dir, self.run, opts.owner_timeout, f"consumer {opts.consumer!r} of {opts.subscription}")
        # Two events: stop() ends the leaser first and the heartbeat last, so the lock stays
        # live as long as any thread of this run may still act on the ledger's leases.
        self._stop = threading.Event()  # the leaser's
        self._stop_beat = threading.Event()  # the heartbeat's
        self._take_ownership()
        # The heartbeat has its own thread: a slow lease extension must not let the lock go stale.
        self._beater = threading.Thread(target=self._beat, name=f"deltabus-stream-owner-{opts.consumer}", daemon=True)
        self._beater.start()
        try:
            self.lock = threading.RLock()
            self.ledger = self._load()
            self.known: int | None = None  # the newest offset Spark holds, as this process learnt it
            # Live batches' deliveries: key -> (batch, newest ack id); batch -> its keys in order.
            self.ack_ids: dict[policy.Key, str] = {}
            self.batch_of: dict[policy.Key, int] = {}
            self.keys_of: dict[int, list[policy.Key]] = {}
            self.leased_at: dict[int, float] = {}
            for n in self.ledger.batches:
                self._load_keys(n)
        except BaseException:
            self._stop_beat.set()
            self._beater.join(10)
            self._release()
            raise
        self._thread = threading.Thread(target=self._leaser, name=f"deltabus-stream-leaser-{opts.consumer}", daemon=True)
        self._thread.start()
        self._watch: Any = None

    # the owner lock (one running query per subscription and consumer; see acquire_owner)
    def _owner_path(self) -> str:
        return self.owner.path

    @property
    def since(self) -> float | None:
        """When this run took the ledger (owner.json "since": nack_failed reads it)."""
        return self.owner.since

    @property
    def lost(self) -> str | None:
        """Set when another run took the ledger over: every call fails."""
        return self.owner.lost

    def _take_ownership(self) -> None:
        """Wait for the ledger's owner to go: its heartbeat older than ownerTimeout, or its
        process gone (same host); refuse after ownerTimeout and a few seconds more."""
        from ..errors import FailedPrecondition

        give_up = time.time() + self.opts.owner_timeout + 5
        while True:
            try:
                holder = self.owner.try_acquire()
            except BaseException:  # the flock refused, say: leave no heartbeat file behind
                self.owner.give_up()
                raise
            if holder is None:
                return
            if time.time() >= give_up:
                self.owner.give_up()
                raise FailedPrecondition(
                    f"consumer {self.opts.consumer!r} of {self.opts.subscription} is in use by another running query "
                    f"(pid {holder.get('pid')} on {holder.get('host')}): one query per subscription and consumer; "
                    "stop it or choose another consumer option"
                )
            time.sleep(0.5)

    def _beat(self) -> None:
        """Renew this run's heartbeat file while owner.json is still this run's."""
        interval = heartbeat_interval(self.opts.owner_timeout)
        while not self._stop_beat.wait(interval):
            if not self.owner.beat():
                return

    def check_owner(self) -> None:
        """Before state is saved or a manifest written: this run still holds the ledger."""
        from ..errors import FailedPrecondition

        refused = self.owner.refusal()
        if refused is not None:
            raise FailedPrecondition(refused)

    def _release(self) -> None:
        self.owner.release()

    # records and state
    def record(self) -> Any:
        from ..errors import FailedPrecondition, SubscriptionDetached

        rec = self.registry.subscription(self.opts.subscription)
        if rec.detached:
            raise SubscriptionDetached(rec.name)
        if rec.push_config.is_push:
            raise FailedPrecondition(f"{rec.name} is a push subscription; the deltabus stream source needs a pull subscription")
        return rec

    def lease_seconds(self, rec: Any) -> int:
        seconds = self.opts.lease_seconds or int(rec.ack_deadline_seconds)
        return max(60, seconds) if rec.enable_exactly_once_delivery else seconds

    def _load(self) -> policy.Ledger:
        path = os.path.join(self.dir, "state.json")
        if not os.path.exists(path):
            return policy.Ledger()
        with open(path) as f:
            return policy.Ledger.from_json(json.load(f))

    def _save(self, ledger: policy.Ledger) -> None:
        # Owner re-read and rename under the flock stale removal takes: another run may have
        # taken the ledger since this call began, and a check before an unlocked write could pass
        # just before the takeover.
        _write_json(os.path.join(self.dir, "state.json"), ledger.to_json(), self.owner.guard)
        self.ledger = ledger

    def _load_keys(self, n: int) -> None:
        import pyarrow.parquet as pq

        keys: list[policy.Key] = []
        for path in manifest_files(self.dir, n):
            t = pq.read_table(path, columns=["seq", "message_id", "message_version", "ack_id"])
            for _, m, v, a in sorted(zip(*(t[c].to_pylist() for c in ("seq", "message_id", "message_version", "ack_id")))):
                keys.append((m, v))
                self.ack_ids[(m, v)] = a
                self.batch_of[(m, v)] = n
        self.keys_of[n] = keys
        self.leased_at[n] = time.time()

    def offset(self, n: int) -> Offset:
        # The warehouse lets the driver's listener find the ledger of a failed query (nack_failed).
        return {"batch": n, "consumer": self.opts.consumer, "sub": self.sub_uid, "warehouse": self.warehouse_path}

    @property
    def warehouse_path(self) -> str:
        return os.path.dirname(self.opts.ledger_root)

    def batch_number(self, offset: Mapping[str, Any]) -> int:
        if offset.get("sub", self.sub_uid) != self.sub_uid or offset.get("consumer", self.opts.consumer) != self.opts.consumer:
            raise InvalidArgument(
                "consumer",
                f"the checkpoint's offsets belong to consumer {offset.get('consumer')!r} of subscription uid "
                f"{offset.get('sub')!r}, not {self.opts.consumer!r} of {self.sub_uid!r}: use a new checkpoint location",
            )
        return int(offset["batch"])

    # Spark's calls
    def latest(self) -> Offset:
        self.check_owner()
        with self.lock:
            pending = self.ledger.pending
            if pending is not None:  # offered again until Spark plans it (also an earlier run's)
                return self.offset(pending)
            rows = self._lease_rows()
            offer = self._idle_offer(rows)
            if offer is not None and rows is not None and self.opts.pull_wait_seconds > 0:
                self._wait()
                rows = self._lease_rows()
                offer = self._idle_offer(rows)
            if offer is not None:
                return self.offset(offer)
            if rows is None:  # no lease (clock uncertain) but a batch is due: an empty one (policy.idle_offer)
                rows = MANIFEST_SCHEMA.empty_table()
            ledger, n = policy.new_batch(self.ledger)
            write_manifest(self.dir, n, rows, self.opts.rows_per_partition, self.owner.guard)
            self._save(ledger)
            keys = list(zip(rows["message_id"].to_pylist(), rows["message_version"].to_pylist()))
            self.keys_of[n] = keys
            self.leased_at[n] = time.time()
            for key, ack in zip(keys, rows["ack_id"].to_pylist()):
                self.ack_ids[key] = ack
                self.batch_of[key] = n
            self.known = n
            return self.offset(n)

    def _idle_offer(self, rows: pa.Table | None) -> int | None:
        """None: make a batch (of `rows`, or an empty one); else the offset to offer again."""
        if rows is not None and rows.num_rows:
            return None
        newest = self.ledger.newest_planned
        return policy.idle_offer(self.ledger, self.known, newest is not None and bool(self.keys_of.get(newest)))

    def _wait(self) -> None:
        from ..watch import watcher

        if self._watch is None:
            lw = watcher()
            uris = []
            for table in ("messages", "deliveries"):
                uri = self.engine.table_uri(table)
                lw.watch(uri, _version_reader(self.engine, table))
                uris.append(uri)
            self._watch = (lw, uris, lw.current(uris))
        lw, uris, seen = self._watch
        lw.wait_newer(seen, self.opts.pull_wait_seconds)
        self._watch = (lw, uris, lw.current(uris))

    def _lease_rows(self) -> pa.Table | None:
        """Pull up to maxMessagesPerTrigger new deliveries; None when the clock is uncertain."""
        from ..delivery.model import Result
        from ..delivery.operations import acknowledge_results, pull
        from ..delivery.payloads import read_payloads
        from ..errors import ClockUncertain
        from ..storage.arrow import plain
        from .. import ackid

        rec = self.record()
        lease = self.lease_seconds(rec)
        self.ledger = policy.expire_unsettled(self.ledger, time.time())
        emitted: list[tuple[str, int, int, str]] = []  # message_id, version, attempt, ack id
        remaining = self.opts.max_messages_per_trigger
        while remaining > 0:
            want = min(remaining, MAX_PULL)
            try:
                leases = pull(self.engine, rec, max_messages=want, lease_seconds=lease, clock=self.clock, history=self.history)
            except ClockUncertain as e:
                log.warning("stream %s: no lease this trigger: %s", rec.name, e)
                if not emitted:
                    return None
                break
            self.activity.used(rec)
            keys = [(l.message_id, l.message_version) for l in leases]
            split = policy.absorb(keys, self.batch_of, self.ledger.unsettled)
            for key, i in split.renewed.items():
                l = leases[i]
                self.ack_ids[key] = ackid.encode(rec.sub_uid, l.message_id, l.delivery_attempt, l.message_version)
            if split.ack_now:
                refs = [(leases[i].message_id, leases[i].delivery_attempt, leases[i].message_version) for i in split.ack_now]
                results = acknowledge_results(self.engine, rec, refs, history=self.history)
                # Only those acked leave `unsettled`: one whose ack did not apply comes back, and stays out then too.
                settled = {keys[i] for i, r in zip(split.ack_now, results) if r.result is Result.SUCCESS}
                unsettled = {k: t for k, t in self.ledger.unsettled.items() if k not in settled}
                self._save(replace(self.ledger, unsettled=unsettled))
            for i in split.emit:
                l = leases[i]
                emitted.append((l.message_id, l.message_version, l.delivery_attempt,
                                ackid.encode(rec.sub_uid, l.message_id, l.delivery_attempt, l.message_version)))
            remaining = self.opts.max_messages_per_trigger - len(emitted)
            if len(leases) < want:
                break
        ids = [e[0] for e in emitted]
        payloads = plain(read_payloads(self.engine, rec.topic_uid, pa.array(ids, pa.string())))
        index = {m: i for i, m in enumerate(payloads["message_id"].to_pylist())}
        keep = [j for j, e in enumerate(emitted) if e[0] in index]
        if len(keep) < len(emitted):  # gone from messages (retention): the lease just lapses, as pull's
            log.error("stream %s: %d leased messages have no payload", rec.name, len(emitted) - len(keep))
        take = pa.array([index[emitted[j][0]] for j in keep], pa.int64())
        rows = payloads.take(take)
        keys_col = rows["ordering_key"].fill_null("")
        return pa.table(
            {
                "seq": pa.array(range(len(keep)), pa.int64()),
                "message_id": pa.array([emitted[j][0] for j in keep], pa.string()),
                "message_version": pa.array([emitted[j][1] for j in keep], pa.int64()),
                "ack_id": pa.array([emitted[j][3] for j in keep], pa.string()),
                "delivery_attempt": pa.array([emitted[j][2] for j in keep], pa.int32()),
                "data": rows["data"].fill_null(b""),
                "attributes": rows["attributes"],
                "ordering_key": keys_col,
                "publish_time": rows["publish_time"],
            }
        ).cast(MANIFEST_SCHEMA)

    def partitions(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> list[ManifestPart]:
        self.check_owner()
        with self.lock:
            s, e = self.batch_number(start), self.batch_number(end)
            if s == e:  # Spark's restart probe: e is the newest batch in its offset log
                ledger, to_ack = policy.probe(self.ledger, e)
                if ledger is not self.ledger:
                    self._save(ledger)
                self.known = e
                self._ack(to_ack)
                return []
            gone = policy.abandoned(self.ledger, s, e)
            try:
                ledger, to_ack = policy.plan(self.ledger, s, e)
            except policy.LineageConflict as err:
                from ..errors import FailedPrecondition

                raise FailedPrecondition(
                    f"consumer {self.opts.consumer!r} of {self.opts.subscription}: {err} (one checkpoint per consumer "
                    "option: a query planning another query's batch could ack what that query has not committed)"
                ) from None
            except (LookupError, ValueError) as err:  # a batch not in the ledger, or offsets out of order
                from ..errors import FailedPrecondition

                raise FailedPrecondition(f"consumer {self.opts.consumer!r} of {self.opts.subscription}: {err}") from None
            self._save(policy.drop(ledger, gone))  # recorded before Spark reads it
            self.known = e
            files = manifest_files(self.dir, e)
            self._nack_dropped(gone)
            self._ack(to_ack)
            return [ManifestPart(f, self.opts.subscription) for f in files]

    def _nack_dropped(self, batches: Sequence[int]) -> None:
        """Release the leases of batches dropped from the ledger (an older checkpoint's)."""
        from ..delivery.operations import modify_deadline_results
        from .. import ackid

        refs = []
        for n in batches:
            for key in self.keys_of.pop(n, []):
                if self.batch_of.get(key) == n:
                    del self.batch_of[key]
                    d = ackid.decode(self.ack_ids.pop(key))
                    refs.append((d.message_id, d.delivery_attempt, d.message_version))
            self.leased_at.pop(n, None)
            self._remove_manifest(n)
        if refs:
            log.warning("stream %s: %d messages of batches %s of an older checkpoint handed back", self.opts.subscription,
                        len(refs), list(batches))
            modify_deadline_results(self.engine, self.record(), refs, 0, clock=self.clock, history=self.history)

    def _remove_manifest(self, n: int) -> None:
        """Under the owner's guard: batch numbers are only reused by a ledger's owner, so a
        run that lost the ledger must not remove a manifest the new owner may have written."""
        with self.owner.guard():
            shutil.rmtree(os.path.join(self.dir, f"m-{n}"), ignore_errors=True)

    def commit(self, end: Mapping[str, Any]) -> None:
        self.check_owner()
        with self.lock:
            # Only the chain ending at `end`: batches another checkpoint planned are not this query's to ack.
            self._ack(policy.committed_by(self.ledger, self.batch_number(end)))

    def _ack(self, batches: Sequence[int]) -> None:
        from ..delivery.operations import acknowledge_results
        from ..delivery.model import Result
        from .. import ackid

        if not batches:
            return
        rec = self.registry.subscription(self.opts.subscription)
        for n in batches:
            keys = self.keys_of.get(n, [])
            refs = []
            for key in keys:
                d = ackid.decode(self.ack_ids[key])
                refs.append((d.message_id, d.delivery_attempt, d.message_version))
            results = acknowledge_results(self.engine, rec, refs, history=self.history) if refs else []
            failed = [keys[i] for i, r in enumerate(results) if r.result is not Result.SUCCESS]
            if failed:
                log.info("stream %s: %d acks of batch %d did not apply (kept out of later batches)", rec.name, len(failed), n)
            self._save(policy.acked(self.ledger, n, failed, time.time() + UNSETTLED_SECONDS))
            self._remove_manifest(n)
            for key in keys:
                if self.batch_of.get(key) == n:
                    del self.batch_of[key]
                    self.ack_ids.pop(key, None)
            self.keys_of.pop(n, None)
            self.leased_at.pop(n, None)

    # the leaser
    def _leaser(self) -> None:
        from ..delivery.operations import modify_deadline_results
        from ..policy.leases import next_pass_delay
        from .. import ackid

        due = 0.0  # at once: re-take the leases of an earlier run's batches
        while not self._stop.wait(min(HEARTBEAT_SECONDS, max(0.0, due - time.monotonic()))):
            if self.lost is not None:
                return
            if due > time.monotonic():
                continue
            try:
                rec = self.registry.subscription(self.opts.subscription)
                lease = self.lease_seconds(rec)
                due = time.monotonic() + next_pass_delay(lease, random.random())
                now = time.time()
                with self.lock:
                    ids = [self.ack_ids[k] for n, keys in self.keys_of.items() if now - self.leased_at.get(n, now) < self.opts.max_lease_duration
                           for k in keys if k in self.ack_ids]
                if ids:
                    refs = []
                    for a in ids:
                        d = ackid.decode(a)
                        refs.append((d.message_id, d.delivery_attempt, d.message_version))
                    modify_deadline_results(self.engine, rec, refs, lease, clock=self.clock, history=self.history)
            except Exception:  # the next pass tries again; a lapsed lease is absorbed when re-pulled
                log.exception("stream %s: lease extension failed", self.opts.subscription)
                due = time.monotonic() + 1.0

    STOP_JOIN_SECONDS = 10.0

    def stop(self) -> None:
        """Stop the leaser, then the heartbeat, then release owner.json (under the flock, only
        if still this run's). A leaser still running after STOP_JOIN_SECONDS (a lease extension
        stuck on storage, say) keeps the heartbeat going: a background thread finishes the stop
        when it ends, so the lock never goes stale while a thread of this run still runs."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.STOP_JOIN_SECONDS)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            log.warning("stream %s: %s still running %g s after stop; owner.json is released when it ends",
                        self.opts.subscription, self._thread.name, self.STOP_JOIN_SECONDS)
            threading.Thread(target=self._finish_stop, args=(None,), name=f"{self._thread.name}-stop", daemon=True).start()
            return
        self._finish_stop(self.STOP_JOIN_SECONDS)

    def _finish_stop(self, wait: float | None) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(wait)
        self._stop_beat.set()
        if self._beater is not threading.current_thread():
            self._beater.join(self.STOP_JOIN_SECONDS)
        self._release()


def _read_owner(path: str) -> dict[str, Any] | None:
    """owner.json's doc; None when it is missing or not an owner doc (not JSON, not an
    object). Any other OSError (EIO, ESTALE: the storage, for now) is raised: it says nothing
    about who owns the ledger, so callers try again rather than judge the owner gone."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def heartbeat_interval(timeout: float) -> float:
    """How often a run renews its heartbeat: a quarter of ownerTimeout (so three renewals
    can be late before it goes stale), at most every 2 s."""
    return min(HEARTBEAT_SECONDS, timeout / 4)


class LockBusy(Exception):
    """``<owner.json>.lock`` stayed held past the caller's bound."""


@contextmanager
def _flocked(path: str, deadline: float) -> Iterator[None]:
    """Hold the exclusive ``flock`` of ``<path>.lock`` (released by the kernel when the
    process dies: never stale itself). Taken with LOCK_NB and retried until `deadline`
    (time.time()), then LockBusy: a holder stuck on storage must not hang the caller past
    its own give-up time. Its holders keep it for a re-read and a rename or removal."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _take_flock(fd, f"{path}.lock", deadline)
        yield
    finally:
        os.close(fd)


def _take_flock(fd: int, name: str, deadline: float) -> None:
    """The exclusive flock of `fd` (the file `name`), retried while another holder has it
    until `deadline`, then LockBusy. Any other refusal (ENOLCK, EOPNOTSUPP: a FUSE or SMB
    mount, say) fails closed with FailedPrecondition: without the lock a stale removal and a
    write of the owner could interleave and give the ledger two writers."""
    import fcntl

    from ..errors import FailedPrecondition

    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.time() >= deadline:
                raise LockBusy(f"{name} is held by another run") from None
            time.sleep(0.01)
        except OSError as e:
            raise FailedPrecondition(
                f"cannot flock {name} ({e.strerror or e}): the warehouse's file system must support flock "
                "for the deltabus stream source's owner lock (one running query per subscription and consumer)"
            ) from e


class OwnerLock:
    """The exclusive owner lock of one ledger directory (one running query per subscription
    and consumer).

    ``owner.json`` names the run ({"run", "host", "pid", "since", "beat"}) and is never
    rewritten after it is linked: a write to it could land after another run has taken the
    lock (a heartbeat delayed past ownerTimeout, say) and name the old run again, giving two
    owners. The heartbeat is the mtime of the run's own file ``heartbeat-<run>.touch``
    (named by "beat"), renewed with ``os.utime`` and never created by the renewal: a late
    renewal only touches its own file, or fails once the new owner removed it. Staleness:
    that file unchanged for ownerTimeout, or the owner's process gone (same host); the age is
    the acquirer's own file's fresh mtime less the heartbeat's (one clock: the file system's,
    a file server's on a mount, not this host's time.time()). Every
    write to the ledger (``guard``) re-reads owner.json under the flock that stale removal
    takes, so no write of this run lands after another run's link."""

    def __init__(self, directory: str, run: str, timeout: float, name: str) -> None:
        self.dir = directory
        self.path = os.path.join(directory, "owner.json")
        self.run = run
        self.timeout = timeout
        self.name = name  # "consumer 'c' of projects/p/subscriptions/s", for messages
        self.beat_path = os.path.join(directory, f"heartbeat-{run}.touch")
        self.since: float | None = None  # when this run's owner.json was linked (S3: nack_failed compares it)
        self.lost: str | None = None

    def doc(self, since: float) -> dict[str, Any]:
        return {"run": self.run, "host": socket.gethostname(), "pid": os.getpid(), "since": since,
                "beat": os.path.basename(self.beat_path)}

    def try_acquire(self) -> dict[str, Any] | None:
        """One attempt: None when this run holds the lock (then `since` is set), else the
        holder's doc. "since" is the time of this attempt, not of the first: a run that waited
        for the previous owner must not claim to have owned the ledger while it still ran."""
        with open(self.beat_path, "a"):
            pass
        fs_now = _fs_now(self.beat_path)
        since = time.time()
        holder = acquire_owner(self.path, self.doc(since), self.timeout)
        if holder is None:
            self.since = since
            self._clean_leftovers(fs_now)
        return holder

    def give_up(self) -> None:
        try:
            os.remove(self.beat_path)
        except OSError:
            pass

    def _clean_leftovers(self, fs_now: float) -> None:
        """Temporary files of a killed owner (state.json's, a manifest's), heartbeat files of
        runs gone long ago, and owner.json.tmp-* unchanged for ownerTimeout (a SIGKILLed
        acquirer's: a live one's is at most one attempt old, and touched at each staleness
        check; acquire_owner ends an attempt whose file went). Ages on the file system's clock."""
        old = fs_now - (2 * self.timeout + 10)  # longer than any acquirer waits (ownerTimeout + 5)
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            try:
                if name.startswith("state.json.tmp-"):
                    os.remove(path)
                elif name.startswith(".m-") and ".tmp-" in name:
                    shutil.rmtree(path, ignore_errors=True)
                elif name.startswith("heartbeat-") and path != self.beat_path and os.path.getmtime(path) < old:
                    os.remove(path)
                elif name.startswith("owner.json.tmp-") and os.path.getmtime(path) < fs_now - self.timeout:
                    os.remove(path)
            except OSError:
                pass

    def beat(self) -> bool:
        """Renew the heartbeat; False (and `lost` set) once this run no longer holds the lock.
        True also when owner.json could not be read this time (the next beat reads it again)."""
        try:
            os.utime(self.beat_path)
        except FileNotFoundError:
            pass  # removed with a stale owner.json: still_owner says so
        except OSError:
            log.exception("%s: could not renew the heartbeat %s", self.name, self.beat_path)
        return self.refusal() is None or self.lost is None

    def still_owner(self) -> bool:
        """Re-read owner.json: False when this run cannot confirm it holds it (see refusal)."""
        return self.refusal() is None

    def refusal(self) -> str | None:
        """Re-read owner.json: None when this run holds it; else why not. `lost` is set (for
        good) only when owner.json is gone or names another run; a read that fails otherwise
        (EIO, ESTALE) refuses this one write and is tried again at the next check."""
        if self.lost is not None:
            return self.lost
        try:
            owner = _read_owner(self.path)
        except OSError as e:
            log.warning("%s: could not read %s (%s); trying again at the next check", self.name, self.path, e)
            return f"{self.name}: could not read {self.path} ({e.strerror or e}) to confirm this run owns it; nothing was written"
        if owner is not None and owner.get("run") == self.run:
            return None
        self.lost = (f"{self.name} was taken over by another run "
                     f"(pid {(owner or {}).get('pid')} on {(owner or {}).get('host')}; owner.json "
                     f"{'replaced' if owner else 'removed'}): this query stops using it")
        log.error("stream %s", self.lost)
        return self.lost

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Hold the flock and check this run still owns the ledger: a write done inside lands
        before any other run can remove owner.json, or not at all (FailedPrecondition)."""
        from ..errors import FailedPrecondition

        try:
            with _flocked(self.path, time.time() + self.timeout):
                refused = self.refusal()
                if refused is not None:
                    raise FailedPrecondition(refused)
                yield
        except LockBusy as e:
            raise FailedPrecondition(f"{self.name}: {e} for over ownerTimeout ({self.timeout:g} s); "
                                     "nothing was written") from None

    def release(self) -> None:
        """Remove owner.json if it is still this run's (re-read under the flock, so the file of
        a run that took over meanwhile is never removed), and this run's heartbeat file."""
        from ..errors import FailedPrecondition

        try:
            with _flocked(self.path, time.time() + self.timeout):
                owner = _read_owner(self.path)
                if owner is not None and owner.get("run") == self.run:
                    os.remove(self.path)
        except (LockBusy, OSError, FailedPrecondition):
            log.warning("%s: owner.json not released; it expires after ownerTimeout", self.name, exc_info=True)
        self.give_up()


def acquire_owner(path: str, doc: Mapping[str, Any], timeout: float) -> dict[str, Any] | None:
    """One attempt to make `doc` (with its "run") the owner at `path`; None when it is, else
    the holder's doc ({} when unreadable). Atomic among racers: the doc is written to a
    temporary file, fsynced, and hard-linked to `path`, which fails when `path` exists (so
    of racers for a free lock exactly one links); the winner re-reads `path` to confirm. A
    stale holder (see OwnerLock; or a "heartbeat" stamp older than `timeout` in a doc with no
    heartbeat file) is removed under an exclusive ``flock`` of ``<path>.lock`` and only after
    re-reading that the same file (inode and doc) is still the stale one, so a racer never
    removes the file of a run that has just won. Ages are measured on the file system's clock
    (the temporary file touched, _fs_now), the clock that set the heartbeat's mtime."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    try:
        return _link_owner(path, tmp, doc, timeout)
    except FileNotFoundError:
        if os.path.exists(tmp) or not os.path.isdir(os.path.dirname(path)):
            raise
        # The temporary file was removed as a killed acquirer's leftover (this attempt outlasted
        # ownerTimeout, waiting for the flock): the attempt ends; the next writes a new one.
        try:
            return _read_owner(path) or {}
        except OSError:
            return {}
    finally:
        try:
            os.remove(tmp)
        except OSError:
            pass


def _link_owner(path: str, tmp: str, doc: Mapping[str, Any], timeout: float) -> dict[str, Any] | None:
    """acquire_owner's attempts with its written temporary file `tmp`."""
    for _ in range(10):
        try:
            os.link(tmp, path)
        except FileExistsError:
            ino = _inode(path)
            try:
                holder = _read_owner(path)
            except OSError:
                return {}  # held, by whom cannot be read now: not stale; the next attempt reads again
            if holder is not None and holder.get("run") == doc["run"]:
                return None
            if not _owner_stale(path, holder, timeout, _fs_now(tmp)):
                return holder if holder is not None else {}
            _remove_stale(path, holder, ino, timeout, tmp)
            continue
        _fsync_dir(os.path.dirname(path))
        try:
            holder = _read_owner(path)
        except OSError:
            return {}  # linked but not confirmed: the next attempt finds its own doc, or the holder's
        if holder is not None and holder.get("run") == doc["run"]:
            return None
        return holder if holder is not None else {}
    try:
        return _read_owner(path) or {}
    except OSError:
        return {}


def _fs_now(probe: str) -> float:
    """The file system's clock now: `probe` (a file of the caller's own, in the ledger's
    directory) touched and its mtime read back. Heartbeat mtimes are set by the same clock
    (a file server's, on a mount), so their age is measured without the local clock's skew."""
    os.utime(probe)
    return os.stat(probe).st_mtime


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _owner_stale(path: str, holder: Mapping[str, Any] | None, timeout: float, fs_now: float) -> bool:
    if holder is not None:
        return _owner_gone(path, holder, timeout, fs_now)
    try:  # unreadable (not written by acquire_owner): stale once unchanged for `timeout`
        return fs_now - os.path.getmtime(path) > timeout
    except FileNotFoundError:
        return True  # gone meanwhile: try again
    except OSError:
        return False  # cannot tell now (EIO, ESTALE): not stale; the next attempt looks again


def _remove_stale(path: str, stale: Mapping[str, Any] | None, ino: int | None, timeout: float, probe: str) -> None:
    try:
        with _flocked(path, time.time() + timeout):
            try:
                now = _read_owner(path)
            except OSError:
                return  # cannot be read now: not judged stale; the caller tries again
            if now != stale or _inode(path) != ino or not _owner_stale(path, now, timeout, _fs_now(probe)):
                return  # renewed, or already replaced by a racer's fresh owner: not ours to remove
            try:
                os.remove(path)
            except FileNotFoundError:
                return
            beat = _beat_file(path, stale)
            if beat is not None:  # the stale run's later renewals fail and it learns it lost
                try:
                    os.remove(beat)
                except OSError:
                    pass
    except LockBusy:
        return  # the caller tries again


def _beat_file(path: str, owner: Mapping[str, Any] | None) -> str | None:
    name = (owner or {}).get("beat")
    if not isinstance(name, str) or not name.startswith("heartbeat-") or "/" in name or os.sep in name:
        return None
    return os.path.join(os.path.dirname(path), name)


def _beat_age(path: str, owner: Mapping[str, Any], fs_now: float) -> float | None:
    """How long ago the owner last beat: `fs_now` (the file system's clock) less its heartbeat
    file's mtime; a doc without one (written by an earlier version) carries a "heartbeat"
    stamp of its writer's clock, compared with this host's; else owner.json's own mtime (it is
    never rewritten, so a run whose heartbeat file is gone goes stale ownerTimeout after its
    link). None when owner.json is gone; 0 when a file cannot be read now (not judged stale)."""
    beat = _beat_file(path, owner)
    if beat is not None:
        try:
            return fs_now - os.path.getmtime(beat)
        except FileNotFoundError:
            pass
        except OSError:
            return 0.0
    stamp = owner.get("heartbeat")
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and beat is None:
        return time.time() - float(stamp)
    try:
        return fs_now - os.path.getmtime(path)
    except FileNotFoundError:
        return None
    except OSError:
        return 0.0


def _owner_gone(path: str, owner: Mapping[str, Any], timeout: float, fs_now: float) -> bool:
    age = _beat_age(path, owner, fs_now)
    if age is None or age > timeout:
        return True
    pid = owner.get("pid")
    if owner.get("host") == socket.gethostname() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True  # killed (SIGKILL leaves no chance to release it): no need to wait
        except PermissionError:
            return False
        try:  # a killed runner stays a zombie until reaped (seen: ~2 s after a process group's SIGKILL)
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return False
    return False


def _version_reader(engine: Any, table: str) -> Callable[[], int]:
    return lambda: int(engine.version(table))


_RUNTIMES: dict[tuple[str, str, str], _Runtime] = {}
_RUNTIMES_LOCK = threading.Lock()  # guards _RUNTIMES, _BUILDING and _LISTENED; never held while a runtime is built
_BUILDING: dict[tuple[str, str, str], threading.Lock] = {}


def _runtime(opts: StreamOptions) -> _Runtime:
    """The process's runtime for these options, built on first use. Building is slow (the
    engine, the owner lock's wait, the manifests): it happens outside _RUNTIMES_LOCK, under a
    per-key lock, so other keys are not held up and one key is not built twice."""
    key = (opts.warehouse, opts.subscription, opts.consumer)
    with _RUNTIMES_LOCK:
        rt = _RUNTIMES.get(key)
        if rt is not None:
            return rt
        building = _BUILDING.setdefault(key, threading.Lock())
    with building:
        with _RUNTIMES_LOCK:
            rt = _RUNTIMES.get(key)
        if rt is not None:
            return rt
        made = _Runtime(opts)
        with _RUNTIMES_LOCK:
            rt = _RUNTIMES.setdefault(key, made)
    if rt is not made:  # inserted meanwhile by a caller that did not wait on `building`: keep that one
        made.stop()
    return rt


# -- Spark's classes ---------------------------------------------------------------------------
class SubscriptionStreamReader(DataSourceStreamReader):
    """Holds only the options (picklable; opens nothing until Spark calls it)."""

    def __init__(self, opts: StreamOptions) -> None:
        self.opts = opts

    def initialOffset(self) -> Offset:
        rt = _runtime(self.opts)
        if rt.known is None:
            rt.known = 0
        return rt.offset(0)

    def latestOffset(self) -> Offset:
        return _runtime(self.opts).latest()

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        return _runtime(self.opts).partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ManifestPart)
        return read_part(partition)

    def commit(self, end: Offset) -> None:
        _runtime(self.opts).commit(end)

    def stop(self) -> None:
        key = (self.opts.warehouse, self.opts.subscription, self.opts.consumer)
        with _RUNTIMES_LOCK:
            rt = _RUNTIMES.pop(key, None)
        if rt is not None:
            rt.stop()


def check_subscription(opts: StreamOptions) -> None:
    """At load(): the warehouse exists and the subscription is a live pull subscription."""
    from ..registry import Registry
    from ..storage import open_engine
    from ..errors import FailedPrecondition, SubscriptionDetached

    engine = open_engine(opts.warehouse, engine="delta-rs", storage_options=dict(opts.storage_options) or None, create=False)
    rec = Registry(engine, clock=time.time).subscription(opts.subscription)
    if rec.detached:
        raise SubscriptionDetached(rec.name)
    if rec.push_config.is_push:
        raise FailedPrecondition(f"{rec.name} is a push subscription; the deltabus stream source needs a pull subscription")


class SubscriptionSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        check_subscription(StreamOptions.from_options(self.options))
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .source import _ignore_terminal_interrupt

        _ignore_terminal_interrupt()  # called in the stream's source runner process
        return SubscriptionStreamReader(StreamOptions.from_options(self.options))


def register_source(spark: Any) -> None:
    """Make ``spark.readStream.format("deltabus")`` available on `spark` (no listener: what
    ``deltabus.spark.session`` does, so sessions that stream nothing get no Python callbacks)."""
    spark.dataSource.register(SubscriptionSource)


def register(spark: Any) -> None:
    """Make ``spark.readStream.format("deltabus")`` available on `spark`, and add the listener
    that nacks the batch a query of this source failed in (once per session)."""
    spark.dataSource.register(SubscriptionSource)
    with _RUNTIMES_LOCK:
        if spark in _LISTENED:
            return
        listener = _LISTENED[spark] = _nack_on_failure()
    spark.streams.addListener(listener)


def unregister_listener(spark: Any) -> None:
    """Remove the listener ``register`` added to `spark` (if any)."""
    with _RUNTIMES_LOCK:
        listener = _LISTENED.pop(spark, None)
    if listener is not None:
        spark.streams.removeListener(listener)


_LISTENED: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _nack_on_failure() -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class NackOnFailure(StreamingQueryListener):
        """Remembers each query run's last completed end offset of this source (progress is
        posted after the commit log is written); when the run ends with an exception, nacks
        the batches after it (their leases end now instead of after leaseSeconds). A batch
        failing before any batch of the run completed is not seen (no progress event):
        its leases lapse.

        With each end it keeps the end of the trigger that completed it (the progress's
        timestamp, the trigger's start, plus its triggerExecution duration), not the time the
        (asynchronous) listener ran: a new run that took the ledger after it is a later owner
        whose live batches are not the failed run's to nack, however late the listener gets to
        them. The end, not the start: the failed run's own "since" is set inside its first
        trigger, so it is after that trigger's start but never after its end."""

        def __init__(self) -> None:
            self.ends: dict[str, dict[tuple[str, str, str], tuple[int, float]]] = {}

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            for src in event.progress.sources:
                try:
                    end = json.loads(src.endOffset) if src.endOffset else None
                except (TypeError, ValueError):
                    continue
                if isinstance(end, dict) and {"batch", "consumer", "sub", "warehouse"} <= set(end):
                    key = (str(end["warehouse"]), str(end["sub"]), str(end["consumer"]))
                    at = progress_end(getattr(event.progress, "timestamp", None),
                                      getattr(event.progress, "durationMs", None), time.time())
                    self.ends.setdefault(str(event.progress.runId), {})[key] = (int(end["batch"]), at)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            ends = self.ends.pop(str(event.runId), {})
            if event.exception is None:
                return
            for (warehouse, sub_uid, consumer), (batch, at) in ends.items():
                try:
                    nack_failed(warehouse, sub_uid, consumer, batch, at)
                except Exception:
                    log.exception("could not nack the failed batch of stream %s/%s", sub_uid, consumer)

    return NackOnFailure()


def progress_time(stamp: Any, default: float) -> float:
    """A StreamingQueryProgress timestamp ("2026-11-27T03:05:45.123Z", UTC) as epoch seconds;
    `default` (the listener's own clock, later than the progress) when it is not one."""
    from datetime import datetime, timezone

    if not isinstance(stamp, str) or not stamp:
        return default
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return default
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def progress_end(stamp: Any, duration_ms: Any, default: float) -> float:
    """When the trigger of a StreamingQueryProgress ended: its `timestamp` (the trigger's
    start) plus its durationMs["triggerExecution"]; `default` (the listener's own clock,
    later than the end) when either is missing or not one."""
    start = progress_time(stamp, math.nan)
    took = duration_ms.get("triggerExecution") if isinstance(duration_ms, Mapping) else None
    if math.isnan(start) or not isinstance(took, (int, float)) or isinstance(took, bool) or not took >= 0:
        return default
    return start + took / 1000.0


def failed_batches(directory: str, after: int, last_progress: float) -> list[int]:
    """The live batches above `after` (a failed query's last completed batch) of the ledger in
    `directory` that are the failed run's to nack: none when the ledger's current owner took
    it after `last_progress` (the end of the failed run's last completed trigger: a later
    owner is another run, whose live batches these are now). The failed run's own owner.json,
    still present when the listener runs before the run's stop() released it, has a "since"
    inside the run's first trigger, so at or before that end: its batches are nacked."""
    state = os.path.join(directory, "state.json")
    if not os.path.exists(state) or _owned_since(os.path.join(directory, "owner.json")) > last_progress:
        return []
    with open(state) as f:
        ledger = policy.Ledger.from_json(json.load(f))
    return policy.failed_after(ledger, after)  # this run's batches only, not another checkpoint's


def nack_failed(warehouse: str, sub_uid: str, consumer: str, after: int, last_progress: float) -> int:
    """Nack the rows of the live batches above `after` (a query's last completed batch) of a
    ledger, unless the ledger's owner took it after `last_progress` (the end of the failed
    run's last completed trigger; see failed_batches); return how
    many rows were nacked. The batches stay in the ledger (a restart replays them; re-pulled
    rows are absorbed)."""
    import pyarrow.parquet as pq

    from ..delivery.operations import modify_deadline_results
    from ..registry import Registry
    from ..storage import open_engine
    from ..storage.clock import resolve_clock
    from .. import ackid

    directory = os.path.join(warehouse, "_streams", sub_uid, consumer)
    refs = []
    for n in failed_batches(directory, after, last_progress):
        for path in manifest_files(directory, n):
            for a in pq.read_table(path, columns=["ack_id"])["ack_id"].to_pylist():
                d = ackid.decode(a)
                refs.append((d.message_id, d.delivery_attempt, d.message_version))
    if not refs:
        return 0
    engine = open_engine(warehouse, engine="delta-rs", create=False)
    rec = next((r for r in Registry(engine, clock=time.time).subscriptions().values() if r.sub_uid == sub_uid), None)
    if rec is None:
        return 0
    results = modify_deadline_results(engine, rec, refs, 0, clock=resolve_clock(None, None))
    from ..delivery.model import Result

    return sum(1 for r in results if r.result is Result.SUCCESS)


def _owned_since(path: str) -> float:
    """When the ledger's current owner took it (owner.json "since"; the file's mtime for an
    owner file without it); 0 when nobody holds it. Not state.json's mtime: the failed
    run itself writes state, and a new run's ownership is what makes its batches its own."""
    owner = _read_owner(path)
    if owner is None:
        return 0.0
    since = owner.get("since")
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        return float(since)
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


# -- a sink that writes each Spark batch once ----------------------------------------------------------
def idempotent_delta_sink(uri: str, app_id: str, *, storage_options: Mapping[str, str] | None = None) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function appending each micro-batch to the Delta table at `uri`
    with delta-rs, at most once per batch id: the batch id is recorded as application
    transaction `app_id` in the same commit, and the recorded batch id is skipped (Spark's
    replay of its last batch after a crash). A batch id below the recorded one is refused:
    another checkpoint writes under this app id (use one app_id per checkpoint)."""
    if not app_id:
        raise InvalidArgument("app_id", "must be a non-empty string (one per query)")

    def write(df: Any, batch_id: int) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import TableNotFoundError

        from ..storage.maintenance import post_commit_hooks

        table = df.toArrow()
        props = CommitProperties(app_transactions=[Transaction(app_id, int(batch_id))])
        opts = dict(storage_options) if storage_options else None
        try:
            dt = DeltaTable(uri, storage_options=opts)
        except TableNotFoundError:
            write_deltalake(uri, table, mode="append", storage_options=opts, commit_properties=props)
            return
        done = dt.transaction_version(app_id)
        if done is not None and done > batch_id:
            # Spark replays only its last batch; an older id means another checkpoint (a reset
            # one, say) writes under this app id, and skipping would drop messages it then acks.
            from ..errors import FailedPrecondition

            raise FailedPrecondition(
                f"app_id {app_id!r}: {uri} already holds batch {done} of it and this query wrote batch {batch_id}; "
                "use one app_id per checkpoint (a new checkpoint needs a new app_id)")
        if (done is not None and done == batch_id) or table.num_rows == 0:
            return
        write_deltalake(dt, table, mode="append", commit_properties=props,
                        post_commithook_properties=post_commit_hooks(dt.version()))  # a commit a batch: storage/maintenance.py

    return write
