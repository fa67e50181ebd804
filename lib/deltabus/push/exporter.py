"""The push job's Delta export subscriptions (issue 17): lease, append once, ack.

For each subscription with a ``delta_config`` (not detached), ``DeltaExporter.run``:

0. claims the subscription in the target table's log (``export_table.claim``): one job
   exports a subscription, the one whose claim is the earliest; another job (its own
   checkpoint) skips it with an error, since it could lease messages the owner appended but
   has not acked yet and append them again;
1. leases messages through the exporter's own lease path on the pull machinery
   (``SubscriberClient._export_lease``), which respects the filter, ordering keys and
   dead-letter policy. Nothing else may lease an export subscription's messages: pull,
   subscribe, Pull and StreamingPull refuse it (FailedPrecondition), as Pub/Sub refuses
   pulls from BigQuery and Cloud Storage subscriptions;
2. writes the batch's number, ack ids, target table and a random nonce to the subscription's
   pending file (``<checkpoint>/exports/<sub_uid>.json``, by atomic rename), before anything
   is appended (the append's commitInfo carries the nonce);
3. appends the batch to the target table as Delta application transaction
   ``(app_id_for(sub_uid, pending directory), batch)`` (``export_table.append_once``, which skips a batch the
   table already records);
4. acks the batch, then marks the pending file settled (it keeps the batch number: a
   per-subscription high-water mark, so numbering never goes backwards when the table changes).

Batch numbers grow by one per batch. Before a subscription's first batch in a run, and after
any failure, the pending file is reconciled with the table it names (not the current one:
the config may have moved): when that table's log holds the batch's nonce, its append happened (the job died, or failed, between append and ack), so
its ack ids are acked and nothing is appended again; otherwise its messages were never
appended and come back when their leases end. Either way the next batch's number is above
both the high-water mark and the current table's. An ack after the deadline still counts while no one else has received the message; no
puller can lease it (refused) and no other job exports the subscription (the claim), so
only this job's reconciliation leases it next: after a crash at any point, every message
lands in the table exactly once.

A batch that cannot be written (no such path, permission denied, schema mismatch) leaves its
messages unacked: they come back when their ack deadline passes, the backlog shows them, and
``outcomes`` reports the reason (the job puts it in the ``backlog`` table's ``last_status``
and ``last_error``). One subscription's failure never stops the others'. Runs on the job's
thread only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..errors import DeltabusError
from ..registry import SubscriptionRecord
from ..storage import Engine
from . import export_table
from .export_table import ExportError

log = logging.getLogger("deltabus.deliver")

# Messages leased per export batch (one pull, one append, one ack).
EXPORT_BATCH = 1000
# ... and at most this many bytes of them (size_bytes; one larger message goes alone): at
# Pub/Sub's 10 MB per message, 1,000 could otherwise make a 10 GB append held in the driver.
EXPORT_BATCH_BYTES = 64 * 1024 * 1024


# Export batches one micro-batch may run at most: each is a lease, an append and an ack
# commit (~50-100 ms on delta-rs here), and the batch's push outcomes wait for the next
# micro-batch meanwhile. Ten keep that under about a second.
MAX_EXPORT_BATCHES = 10


def export_budget(batch_budget: int, pushed: int) -> int:
    """Messages the exports may take in a micro-batch whose pushes were launched `pushed` of
    its `batch_budget`: what the pushes left, but at least a quarter (exports go on beside a
    push backlog that fills every batch), and at most MAX_EXPORT_BATCHES full batches."""
    if batch_budget <= 0:
        return 0
    return min(max(batch_budget - pushed, batch_budget // 4), MAX_EXPORT_BATCHES * EXPORT_BATCH)


def app_id_for(sub_uid: str, pending_dir: str) -> str:
    """The application transaction id of a subscription's export by the job whose pending
    files are in `pending_dir`: from the subscription's uid (a re-created subscription with
    the same name has a new one) and that directory. Two jobs on one warehouse (each with its
    own checkpoint) lease different messages and count their own batches, so each has its own
    id: with one id, the second to append batch n would find n recorded and skip its batch."""
    scope = hashlib.sha256(os.path.abspath(pending_dir).encode()).hexdigest()[:12]
    return f"deltabus-export-{sub_uid}-{scope}"


@dataclass(frozen=True, slots=True)
class Pending:
    """A leased batch that may have been appended but not yet acked."""

    batch: int
    ack_ids: tuple[str, ...]  # empty: settled; the file then only keeps the batch number (high-water mark)
    table: str = ""  # the table this batch goes to (the config may change before reconciling)
    nonce: str = ""  # in the append's commitInfo: that commit is this batch

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"a batch number is >= 1, got {self.batch}")


class PendingFiles:
    """Each export subscription's pending batch, one small JSON file per subscription uid."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _path(self, sub_uid: str) -> str:
        return os.path.join(self.directory, f"{sub_uid}.json")

    def read(self, sub_uid: str) -> Pending | None:
        try:
            with open(self._path(sub_uid), encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return None
        except ValueError:  # torn by a crash before the rename cannot happen; anything else is not ours
            log.warning("ignoring an unreadable export pending file %s", self._path(sub_uid))
            return None
        try:
            return Pending(int(doc["batch"]), tuple(str(a) for a in doc["ack_ids"]),
                           str(doc.get("table", "")), str(doc.get("nonce", "")))
        except (TypeError, KeyError, ValueError, AttributeError) as exc:  # valid JSON, not ours: this subscription's error
            raise ExportError("error", f"the export pending file {self._path(sub_uid)} is not a pending batch "
                                       f"({type(exc).__name__}); move it away to go on") from None

    def write(self, sub_uid: str, pending: Pending) -> None:
        os.makedirs(self.directory, exist_ok=True)
        final = self._path(sub_uid)
        tmp = f"{final}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"batch": pending.batch, "ack_ids": list(pending.ack_ids), "table": pending.table,
                       "nonce": pending.nonce}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)

    def clear(self, sub_uid: str) -> None:
        try:
            os.remove(self._path(sub_uid))
        except FileNotFoundError:
            pass


@dataclass(slots=True)
class ExportOutcome:
    """One subscription's export figures in a run: messages appended, acked, and the last
    status (``"delta ok"`` or ``"delta <reason>"``) with the error's detail."""

    appended: int = 0
    acked: int = 0
    status: str | None = None
    error: str | None = None


@dataclass(slots=True)
class ExportReport:
    outcomes: dict[str, ExportOutcome] = field(default_factory=dict)  # by sub_uid

    @property
    def appended(self) -> int:
        return sum(o.appended for o in self.outcomes.values())


def export_subscriptions(records: Mapping[str, SubscriptionRecord]) -> dict[str, SubscriptionRecord]:
    """The Delta export subscriptions among `records` (by name), by uid."""
    return {r.sub_uid: r for r in records.values() if r.delta_config is not None and not r.detached}


class DeltaExporter:
    def __init__(
        self,
        engine: Engine,
        pending_dir: str,
        *,
        clock: Callable[[], float],
        storage_options: Mapping[str, str] | None = None,
        batch_size: int | None = None,
        history: bool = True,
    ) -> None:
        """`pending_dir`: where the pending-batch files live (the job's checkpoint);
        `batch_size`: messages per batch, 1..1000 (default ``EXPORT_BATCH``); `history`: record
        the delivery history of its leases and acks (the job's ``delivery_history``)."""
        from ..subscriber import SubscriberClient

        batch_size = EXPORT_BATCH if batch_size is None else batch_size
        if not 1 <= batch_size <= 1000:
            raise ValueError(f"batch_size must be 1..1000, got {batch_size}")
        self._client = SubscriberClient(engine=engine, clock=clock, allow_http=False, history=history)
        self._pending = PendingFiles(pending_dir)
        self._storage_options = storage_options
        self._batch_size = batch_size
        self._next: dict[str, int] = {}  # sub_uid -> the next batch number (absent: reconcile first)
        self._warned: dict[str, str] = {}  # sub_uid -> the error last logged
        self._turn = 0  # runs so far: where the next run starts

    def run(self, subs: Mapping[str, SubscriptionRecord], budget: int) -> ExportReport:
        """Export up to `budget` messages over `subs` (``export_subscriptions``, by uid)."""
        report = ExportReport()
        items = list(subs.items())
        if items:  # each run starts one further along: a large backlog never starves the others of the budget
            start = self._turn % len(items)
            items = items[start:] + items[:start]
            self._turn += 1
        for uid, rec in items:
            out = report.outcomes.setdefault(uid, ExportOutcome())
            try:
                budget -= self._export(rec, out, budget)
            except ExportError as exc:
                self._next.pop(uid, None)  # reconcile before the next batch
                out.status, out.error = f"delta {exc.reason}", str(exc)
                if self._warned.get(uid) != out.error:  # once per new error, not every batch
                    self._warned[uid] = out.error
                    log.warning("export of %s failed; its messages stay unacked: %s", rec.name, exc)
            except (DeltabusError, OSError) as exc:  # the subscription went away, the warehouse refused a call, the pending file
                self._next.pop(uid, None)
                out.status, out.error = "delta error", f"{type(exc).__name__}: {exc}"
                if self._warned.get(uid) != out.error:  # once per new error, as above
                    self._warned[uid] = out.error
                    log.warning("export of %s stopped this round: %s", rec.name, exc)
        return report

    def _app_id(self, sub_uid: str) -> str:
        return app_id_for(sub_uid, self._pending.directory)

    def _reconcile(self, rec: SubscriptionRecord, out: ExportOutcome) -> int:
        """The next batch number, after settling a pending batch (see the module's docstring)."""
        assert rec.delta_config is not None
        uid = rec.sub_uid
        owner = export_table.claim(rec.delta_config, uid, self._app_id(uid), self._storage_options)
        if owner != self._app_id(uid):
            raise ExportError("error", f"exported by another deliver job (application id {owner}, the earliest claim in "
                                       f"{rec.delta_config.table}'s log); one job exports a subscription, so this job skips "
                                       "it: point delta_config at a new table to move the export")
        pending = self._pending.read(uid)
        if pending is not None and pending.ack_ids:
            # Settled against the table the batch was for (its path may have changed since),
            # by the batch's own nonce in that table's log: never by the current table's numbers.
            if pending.nonce:
                appended = export_table.has_nonce(pending.table, pending.nonce, self._storage_options)
            else:  # a file from before nonces: its batch number in the current table, as then
                appended = (export_table.committed_version(rec.delta_config.table, self._app_id(uid),
                                                           self._storage_options) or 0) >= pending.batch
            if appended:
                self._client.acknowledge(subscription=rec.name, ack_ids=list(pending.ack_ids))
                out.acked += len(pending.ack_ids)
                log.info("export of %s: batch %d was appended to %s before a restart or failure; acked it now",
                         rec.name, pending.batch, pending.table)
        committed = export_table.committed_version(rec.delta_config.table, self._app_id(uid), self._storage_options) or 0
        high = max(committed, pending.batch if pending is not None else 0)  # numbering never goes backwards
        if high:
            self._pending.write(uid, Pending(high, ()))
        return high + 1

    def _export(self, rec: SubscriptionRecord, out: ExportOutcome, budget: int) -> int:
        """Export batches of `rec` until it has nothing leasable or `budget` is spent; how many."""
        config = rec.delta_config
        assert config is not None
        uid = rec.sub_uid
        if uid not in self._next:
            self._next[uid] = self._reconcile(rec, out)
        done = 0
        while done < budget:
            received = self._client._export_lease(rec.name, min(self._batch_size, budget - done), EXPORT_BATCH_BYTES)
            if not received:
                break
            batch = self._next[uid]
            ack_ids = [r.ack_id for r in received]
            nonce = secrets.token_hex(16)
            self._pending.write(uid, Pending(batch, tuple(ack_ids), config.table, nonce))
            rows = export_table.rows_for(config, rec.name, received)
            if not export_table.append_once(config, rows, self._app_id(uid), batch, self._storage_options,
                                            sub_uid=uid, nonce=nonce):
                # Another process writing under this job's id (a second job on the same
                # checkpoint) recorded this batch number: these messages were not appended.
                # Leave them leased (they come back) and forget the pending file, so that
                # reconciling does not ack them; it numbers the next batch past the table's.
                self._pending.write(uid, Pending(batch, ()))
                raise ExportError("error", f"batch {batch} is already recorded in the table by another writer with this "
                                           "job's application id (two jobs on one checkpoint?); these messages come back")
            out.appended += len(received)
            self._client.acknowledge(subscription=rec.name, ack_ids=ack_ids)
            self._pending.write(uid, Pending(batch, ()))  # settled; keeps the high-water mark
            self._next[uid] = batch + 1
            out.acked += len(received)
            out.status = "delta ok"
            self._warned.pop(uid, None)
            done += len(received)
        return done

    def close(self) -> None:
        self._client.close()
