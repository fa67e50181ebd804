"""When the push job rewrites the ``backlog`` table, and what its push subscriptions' rows carry.

``BacklogRefresher.refresh`` rewrites the table (``backlog.compute`` per subscription, then
``backlog.write``) at most every ``interval`` seconds, and at most every ``BACKLOG_DUTY``
times the last refresh's duration: a refresh reads the delivered rows and every
subscription's log statistics, so when that grows it runs less often and never takes more
than about a tenth of the job's time. ``force`` refreshes regardless (the final drain, and
the idleness check of ``until_idle``).

Rows of subscriptions the job pushes to (or has state for) carry the job's figures:
delivered / acked / nacked counts, push window, backoff delay, until and reason, last status
and error (``with_push_fields``); a restarted job picks them up again
(``OutcomeLedger.restore``). ``total`` is the unacked count over the push subscriptions as
of the last refresh; ``fresh`` says whether the latest ``refresh`` call computed it, and
``nothing_left`` is true only on a fresh total of 0: idleness is never judged on an old one.

Runs on the job's thread only.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Mapping

from .. import backlog as backlog_mod
from ..backlog import BacklogStats
from ..registry import SubscriptionRecord
from ..storage import Engine
from ..timestamps import utc
from .outcome_ledger import OutcomeLedger
from .state import SubState

# At most this share of the job's time goes to refreshing the backlog table.
BACKLOG_DUTY = 10.0  # refresh at most every 10x the last refresh's duration


def with_push_fields(stats: BacklogStats, st: SubState) -> BacklogStats:
    """A subscription's backlog row with the push job's figures for it."""
    return replace(
        stats, delivered=st.delivered, acked=st.acked, nacked=st.nacked,
        push_window=st.window.limit, backoff_seconds=st.backoff.delay,
        backoff_until=(utc(st.backoff.paused_until)
                       if st.backoff.active and st.backoff.paused_until > 0 else None),
        backoff_reason=st.backoff_reason, last_status=st.last_status, last_error=st.last_error,
    )


class BacklogRefresher:
    def __init__(
        self,
        engine: Engine,
        records: Callable[[], Mapping[str, SubscriptionRecord]],
        *,
        interval: float,
        clock: Callable[[], float],
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`records`: the current subscriptions by name; `interval`: the shortest time between
        refreshes (seconds); `clock`: wall time (the backlog's "now"); `timer`: measures a
        refresh's cost."""
        self._engine = engine
        self._records = records
        self._interval = interval
        self._clock = clock
        self._timer = timer
        self._last = 0.0
        self._cost = 0.0  # seconds the last refresh took
        self.total: int | None = None
        self.fresh = False

    @property
    def nothing_left(self) -> bool:
        """The latest `refresh` computed the backlog, and no push subscription has any."""
        return self.fresh and self.total == 0

    def refresh(self, push: Mapping[str, SubscriptionRecord], book: OutcomeLedger, *, force: bool = False) -> bool:
        """Rewrite the backlog table if due (or `force`); whether it did. `push`: the push
        subscriptions by uid (their backlog makes `total`); `book`: the job's push state."""
        now = self._clock()
        self.fresh = False
        interval = max(self._interval, BACKLOG_DUTY * self._cost)
        if not force and now - self._last < interval:
            return False
        self.fresh = True
        self._last = now
        started = self._timer()
        stats = []
        total = 0
        for rec in sorted(self._records().values(), key=lambda r: r.name):
            b = backlog_mod.compute(self._engine, rec, now)
            if rec.sub_uid in push or rec.sub_uid in book:
                b = with_push_fields(b, book.state(rec.sub_uid))
            if rec.sub_uid in push:
                total += b.num_unacked_messages
            stats.append(b)
        backlog_mod.write(self._engine, stats)
        self.total = total
        self._cost = self._timer() - started
        return True
