"""What a streaming micro-batch is to the push job: its identity, replays, and its rows.

* ``checkpoint_for`` / ``app_id_for``: each engine streams from its own source, so each keeps
  its own checkpoint (and batch ids); the application transaction id is derived from the
  checkpoint and its streaming query's id, so a job restarted on the same checkpoint
  recognises its own commits, and one on a new checkpoint (batch ids from 0 again) does not.
* ``already_committed``: every commit into ``deliveries`` carries (app id, batch id); a batch
  Spark replays after a crash is one whose id is at most the recorded version, and is skipped
  (delta-rs records the version but does not skip a duplicate by itself: FACTS.md).
* ``batch_rows``: the batch's message rows and the messages-table versions it spans.
"""

from __future__ import annotations

import hashlib
from typing import Callable, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..config import ConcreteEngine
from ..storage import Engine, Snapshot
from ..timestamps import TS

# The columns plan.execute reads from a batch (besides range_start/range_end, read here).
BATCH_COLUMNS = pa.schema([
    ("topic_uid", pa.string()), ("message_id", pa.string()), ("publish_time", TS),
    ("ordering_key", pa.string()), ("size_bytes", pa.int64()), ("version", pa.int64()),
])


class BatchRows(NamedTuple):
    rows: pa.Table  # new messages (BATCH_COLUMNS at least)
    first: int  # the first messages-table version the batch covers
    last: int  # the last one


def checkpoint_for(checkpoint_path: str, engine_name: ConcreteEngine) -> str:
    """The push job's checkpoint location under `checkpoint_path` for this engine."""
    suffix = "" if engine_name == "delta-rs" else f"-{engine_name}"
    return f"{checkpoint_path.rstrip('/')}/deliver{suffix}"


def app_id_for(checkpoint: str, query_id: str | None = None) -> str:
    """The application transaction id of the job that streams with this checkpoint.

    With `query_id` (the streaming query's id, which Spark keeps in the checkpoint and makes
    anew when the checkpoint is new) a deleted or replaced checkpoint gets an id of its own.
    Why: the path alone stayed the same across a deleted checkpoint while batch ids started
    again at 0, so ``already_committed`` skipped every new batch up to the last id the old
    checkpoint had recorded: a job that had run 5,000 batches delivered nothing for 5,000
    triggers after its checkpoint was deleted, and said nothing (found by the chaos suite's
    damaged-state scenario). Without it (a job driven without a streaming query, as tests
    do): the path's id, as before."""
    key = checkpoint if query_id is None else f"{checkpoint}\n{query_id}"
    return "deltabus-deliver-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def already_committed(deliveries: Snapshot, app_id: str, batch_id: int) -> bool:
    """Did a commit of batch `batch_id` (or a later one) by `app_id` reach `deliveries`?"""
    done = deliveries.txn_version(app_id)
    return done is not None and done >= batch_id


def batch_rows(batch: pa.Table | Callable[[], pa.Table] | None, engine: Engine) -> BatchRows:
    """The batch's rows (calling `batch` if it is a function) and its version span. A batch
    with no rows spans just the messages table's current version."""
    table = batch() if callable(batch) else batch
    if table is None or table.num_rows == 0:
        last = engine.version("messages")
        return BatchRows(BATCH_COLUMNS.empty_table(), last, last)
    first = int(pc.min(table["range_start"]).as_py())
    last = int(pc.max(table["range_end"]).as_py())
    return BatchRows(table.filter(pc.is_valid(table["message_id"])), first, last)
