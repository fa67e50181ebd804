"""The push requests of a subscription's new leases (``REQUEST_SCHEMA`` rows).

``RequestBuilder.build`` reads the leased messages' payloads from the messages table
(``delivery.payloads.read_payloads``) and adds what each push needs: the endpoint and its
wrapping, the timeout (the ack deadline), the lease's end (a push still waiting in a worker
then is not sent) and, for subscriptions with ``oidc_token``, a signed token. A leased
message without a payload is logged (a count, never an id's payload) and left out: its lease
expires.

Tokens come from a ``TokenSource`` created on first use, so a job without OIDC subscriptions
never makes a signing key. The key file is created 0600 (``auth.SigningKey``); neither the
key nor a token is ever logged. ``tokens()`` is thread-safe (the JWKS server of
``runner.py`` reads the same source); ``build`` runs on the job's thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..delivery.payloads import read_payloads
from ..registry import SubscriptionRecord
from ..storage import Engine
from ..timestamps import to_us
from .auth import SigningKey, TokenSource
from .sender import REQUEST_SCHEMA

log = logging.getLogger("deltabus.deliver")


class RequestBuilder:
    def __init__(self, engine: Engine, *, keys_path: str, issuer: str, clock: Callable[[], float]) -> None:
        """`keys_path`: where the signing key lives (created there on first use); `issuer`:
        the tokens' iss claim; `clock`: wall time for the tokens' iat/exp."""
        self._engine = engine
        self._keys_path = keys_path
        self._issuer = issuer
        self._clock = clock
        self._tokens: TokenSource | None = None
        self._lock = threading.Lock()

    def tokens(self) -> TokenSource:
        """The token source; the signing key is created (0600) on first use."""
        with self._lock:
            if self._tokens is None:
                self._tokens = TokenSource(SigningKey(self._keys_path), issuer=self._issuer, clock=self._clock)
            return self._tokens

    def build(
        self, rec: SubscriptionRecord, leases: Sequence[tuple[str, int]], leased_at: float, lease_expires: float | None = None
    ) -> pa.Table:
        """The push requests (REQUEST_SCHEMA) of `rec`'s leases, given as (message_id,
        delivery_attempt), leased at `leased_at` (seconds since the epoch) until
        `lease_expires` (default: one ack deadline later)."""
        ends = leased_at + rec.ack_deadline_seconds if lease_expires is None else lease_expires
        ids = pa.array([m for m, _ in leases], pa.string())
        payloads = read_payloads(self._engine, rec.topic_uid, ids)
        at = pc.index_in(ids, value_set=payloads["message_id"])
        found = pc.is_valid(at)
        missing = len(ids) - pc.sum(found).as_py() if len(ids) else 0
        if missing:
            log.error("%d leased messages of %s have no payload; their leases will expire", missing, rec.name)
        at = at.filter(found)
        attempts = pa.array([a for _, a in leases], pa.int32()).filter(found)
        rows = payloads.take(at)
        n = rows.num_rows
        pcfg = rec.push_config
        token = None
        if pcfg.oidc_token is not None:
            token = self.tokens().token(pcfg.oidc_token.service_account_email, pcfg.oidc_token.audience or pcfg.push_endpoint)

        def same(value: Any, kind: pa.DataType) -> pa.Array:
            return pa.repeat(pa.scalar(value, kind), n)

        columns = {
            "sub_uid": same(rec.sub_uid, pa.string()),
            "subscription": same(rec.name, pa.string()),
            "message_id": rows["message_id"],
            "delivery_attempt": attempts,
            "endpoint": same(pcfg.push_endpoint, pa.string()),
            "token": same(token, pa.string()),
            "no_wrapper": same(pcfg.no_wrapper is not None, pa.bool_()),
            "write_metadata": same(bool(pcfg.no_wrapper and pcfg.no_wrapper.write_metadata), pa.bool_()),
            "timeout_seconds": same(float(rec.ack_deadline_seconds), pa.float64()),
            "data": pc.fill_null(rows["data"], b""),
            "attributes": rows["attributes"],
            "ordering_key": pc.fill_null(rows["ordering_key"], ""),
            "publish_time": rows["publish_time"],
            "lease_expires": same(to_us(ends), pa.int64()),
        }
        return pa.table({k: columns[k] for k in REQUEST_SCHEMA.names}).cast(REQUEST_SCHEMA)
