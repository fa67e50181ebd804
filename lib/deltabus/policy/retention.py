"""Message retention (issue 15): how far back a topic's messages are still needed. Pure.

A message of a topic may leave the ``messages`` table once nothing can deliver it again:

- the topic's own ``message_retention_duration`` keeps every message that long (any
  subscription of the topic may seek back that far);
- each subscription keeps its messages for its ``message_retention_duration`` (unacked ones
  are delivered until then, acked ones come back by seek with ``retain_acked_messages``);
- a snapshot keeps its stored unacked messages (``oldest_publish_time``) and everything
  committed after its cursor;
- a subscription's fan-out still has to read what was committed after its cursor.

Publish times and commit times differ by the publisher's batching, so a commit-time bound
keeps ``COMMIT_MARGIN`` more; and nothing younger than ``MIN_AGE`` is ever deleted, so a
subscription being created while maintenance reads the registry (its subscription point is
read before its row commits) loses nothing.
"""

from __future__ import annotations

from typing import Iterable

COMMIT_MARGIN = 3600.0
MIN_AGE = 3600.0


def message_cutoff(
    now: float,
    *,
    topic_retention: float | None,
    subscription_retentions: Iterable[float],
    kept_since: Iterable[float],
) -> float:
    """The publish time (seconds) before which the topic's messages are no longer needed.

    `subscription_retentions`: the retention of each attached subscription of the topic.
    `kept_since`: publish times that must stay (each snapshot's oldest unacked message), and
    commit times of the first version a cursor or snapshot still needs (given as they are:
    ``COMMIT_MARGIN`` is taken off here)."""
    keep = max([topic_retention or 0.0, *subscription_retentions])
    cutoff = now - keep
    for since in kept_since:
        cutoff = min(cutoff, since - COMMIT_MARGIN)
    return min(cutoff, now - MIN_AGE)
