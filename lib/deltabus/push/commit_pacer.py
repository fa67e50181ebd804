"""Whether the push job commits in this micro-batch: ``policy/pacing.py`` plus its memory.

``CommitPacer`` keeps what ``CommitPacing.due`` needs between batches: the smoothed rate at
which outcomes come back (``rate_after``) and when the job last committed. Each batch calls
``commit_now`` once with the outcomes it folded and the pushes still queued for a worker;
it updates the rate, and when the answer is yes, records the commit. No I/O; time is passed in.
"""

from __future__ import annotations

from ..policy.pacing import CommitPacing, rate_after


class CommitPacer:
    def __init__(self, pacing: CommitPacing, now: float) -> None:
        """`now`: when the job started (the first rate is measured from there)."""
        self.pacing = pacing
        self.send_rate = 0.0  # outcomes per second, smoothed
        self._last_rate_at = now
        self._last_commit = float("-inf")

    def commit_now(self, now: float, *, settled: int, queued: int, forced: bool = False) -> bool:
        """Commit in this batch? `settled`: outcomes folded in it; `queued`: pushes waiting for
        a worker; `forced`: commit whatever the pacing says (the final drain)."""
        self.send_rate = rate_after(self.send_rate, settled, now - self._last_rate_at)
        self._last_rate_at = now
        if not forced and not self.pacing.due(now, self._last_commit, queued=queued, send_rate=self.send_rate):
            return False
        self._last_commit = now
        return True
