"""Which subscriptions the push job pushes to: push subscriptions whose endpoint it may use,
and that are not detached (a detached subscription is never pushed to: Pub/Sub's
DetachSubscription stops its pushes).

An endpoint must be https, or http when ``allow_http`` is on (tests, local endpoints). A
push subscription whose endpoint is refused is skipped (its messages wait) and logged once
per run, by name only. Runs on the job's thread only.
"""

from __future__ import annotations

import logging
from typing import Mapping

from ..registry import SubscriptionRecord
from ..validation import endpoint_scheme

log = logging.getLogger("deltabus.deliver")


def endpoint_allowed(sub: SubscriptionRecord, allow_http: bool) -> bool:
    """May the job push to `sub`'s endpoint?"""
    scheme = endpoint_scheme(sub.push_config.push_endpoint)
    return scheme == "https" or (allow_http and scheme == "http")


class PushTargets:
    def __init__(self, *, allow_http: bool) -> None:
        self.allow_http = allow_http
        self._warned: set[str] = set()

    def select(self, records: Mapping[str, SubscriptionRecord]) -> dict[str, SubscriptionRecord]:
        """The push subscriptions among `records` (by name) the job may push to, by uid."""
        out = {}
        for rec in records.values():
            if not rec.push_config.is_push or rec.detached:
                continue
            if not endpoint_allowed(rec, self.allow_http):
                if rec.name not in self._warned:
                    log.warning("not pushing to %s: its endpoint is not https and allow_http is off", rec.name)
                    self._warned.add(rec.name)
                continue
            out[rec.sub_uid] = rec
        return out
