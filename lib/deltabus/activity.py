"""Recording that subscriptions are in use, for their expiration policy (issue 15).

Contract: ``ActivityRecorder.used(rec)`` is called by every path that uses a subscription
(the Python client's pull, ack and deadline change, the Pub/Sub API server's rounds, the
push job's batches that push or settle). It writes the subscription's ``last_active`` at
most once per ``policy.expiration.RECORD_INTERVAL`` per process (a registry commit, only
ever moving the time forward); the other calls only read a dict under a lock. A failed
write is logged and retried on a later use: it never fails the caller's operation.
Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .errors import NotFound
from .policy.expiration import RECORD_INTERVAL, record_due
from .registry import Registry, SubscriptionRecord

log = logging.getLogger(__name__)


class ActivityRecorder:
    def __init__(self, registry: Registry, clock: Callable[[], float], *, interval: float = RECORD_INTERVAL) -> None:
        if interval <= 0:
            raise ValueError(f"interval: must be > 0 seconds, got {interval}")
        self._registry = registry
        self._clock = clock
        self._interval = interval
        self._lock = threading.Lock()
        self._recorded: dict[str, float] = {}  # sub_uid -> the time this process last recorded
        self.writes = 0  # registry commits made (a test reads it)

    def used(self, rec: SubscriptionRecord) -> None:
        now = self._clock()
        on_record = rec.last_active.timestamp() if rec.last_active is not None else None
        with self._lock:
            known = [t for t in (self._recorded.get(rec.sub_uid), on_record) if t is not None]
            if not record_due(max(known) if known else None, now, self._interval):
                return
            self._recorded[rec.sub_uid] = now
        try:
            self._registry.record_use(rec, now)
            self.writes += 1
        except NotFound:  # deleted meanwhile: nothing to record
            pass
        except Exception as exc:  # never fail the caller's pull or ack for it; a later use retries
            with self._lock:
                if self._recorded.get(rec.sub_uid) == now:
                    del self._recorded[rec.sub_uid]
            log.warning("could not record the use of %s: %s", rec.name, type(exc).__name__)
