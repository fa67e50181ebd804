"""The one delivery core: fan-out, lease selection, outcomes and the cursor, for every path
(pull, ``subscribe()``, the push job, and the paths to come). See ARCHITECTURE.md.

Modules, one concern each (decisions are pure functions over Arrow tables; only
``merge.commit`` writes, and only ``operations`` and ``push/plan.py`` call it):

- ``model``: ``Op``, ``OutcomeKind``, ``Result``, ``Lease``, ``IdResult``.
- ``cursor``: the fan-out cursor (an app transaction) and the messages after it.
- ``fanout``: new messages after the cursor, from the change feed or a stream batch.
- ``selection``: which rows are available, and who gets a lease.
- ``outcomes``: ack / nack / deadline / expiry / give-up rows and per-id results.
- ``hooks``: the policy seams (filter, retry delay, ordering, attempt limit).
- ``merge``: the OPS MERGE clauses and the one commit.
- ``operations``: pull, acknowledge, modify_deadline for the clients.
- ``payloads``: reading the leased messages' payloads.
- ``detach``: a detached subscription's backlog dropped and its cursor moved past every
  version, in one commit of its own (not an OPS MERGE: it deletes the whole partition).
"""
