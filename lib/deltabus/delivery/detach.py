"""Detaching a subscription from its topic (Pub/Sub's DetachSubscription): its backlog goes,
and nothing is fanned out to it again.

Contract. Detaching is two commits, in this order:

1. the registry marks the subscription ``detached`` (``Registry.detach_subscription``).
   From then on ``hooks.hooks_for`` refuses it (``SubscriptionDetached``, a
   FailedPrecondition), so pull, acks, deadline changes, ``subscribe()`` and the server's
   group commit all refuse it; the push job leaves it out (``push/targets``); its backlog
   figures are zero (``backlog.compute``);
2. ``drop_backlog``: ONE commit on the deliveries table deletes every row of its partition
   and moves its fan-out cursor to ``cursor.DETACHED_CURSOR``. A fan-out or lease that read
   the registry before step 1 and commits around step 2 either commits first (its rows are
   then deleted here: the MERGE pinned to the partition conflicts and this reruns on a fresh
   snapshot) or after (it carries the same cursor app id, or touches the same files, so it
   conflicts and reruns, finding the cursor past every version and no rows).

A crash between the two commits leaves a detached subscription whose rows are still in the
deliveries table: nothing reads them (step 1's refusals hold) and detaching again drops them
(``drop_backlog`` is idempotent). Step 1 goes first so that no crash can leave an attached
subscription whose fan-out has stopped.
"""

from __future__ import annotations

from ..registry import SubscriptionRecord
from ..storage import Engine, MatchedDelete, Snapshot, literal
from ..storage.engine import txn_done
from ..storage.tables import DELIVERIES
from .cursor import DETACHED_CURSOR, cursor_app_id


def drop_backlog(engine: Engine, sub: SubscriptionRecord) -> int:
    """Delete every deliveries row of `sub` and set its cursor to DETACHED_CURSOR, in one
    commit (none when both are done already); return how many rows were deleted."""
    uid = sub.sub_uid
    txn = (cursor_app_id(uid), DETACHED_CURSOR)

    def fn(snap: Snapshot) -> int:
        ids = snap.read(columns=["message_id"], partition=uid)
        if ids.num_rows == 0:
            if not txn_done(snap, txn):
                snap.commit_txns([txn])
            return 0
        metrics = snap.merge(
            ids, f"t.sub_uid = {literal(uid)} AND t.message_id = s.message_id", [MatchedDelete()], app_txn=txn
        )
        return int(metrics.get("num_target_rows_deleted", 0))

    return engine.transact(DELIVERIES.name, fn, what=f"drop the backlog of detached {sub.name}")
