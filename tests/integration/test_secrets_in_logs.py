"""No secret reaches a log: a realistic run, every log record at DEBUG, and everything printed.

The run: the CLI (a subprocess) and the client publish recognisable payloads with a secret
attribute; the pull client pulls, nacks and acks them, streams and acks them, and the
CLI pulls and acks; the push path signs OIDC tokens (``RequestBuilder``, its key made 0600 in
the warehouse as the job does) and pushes them through a real worker (``PoolServer`` +
``Worker``) to an acking endpoint, a 503 one and a refused port, and the job's
``OutcomeLedger`` folds the outcomes and logs its backoff lines. Everything but Spark, whose
run of the real deliver job is checked by ``test_deliver_job.py``'s crash test, on its log.

Then no captured line may hold: a line of the PEM signing key, an issued token (or any of
its parts, or anything JWT-like), a payload (raw or base64), the secret attribute value,
the endpoints' secret query, or the pool's run key. The CLI pull's own output (its stdout,
what the user asked for) is the one place payloads may appear, and is not a log.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import jwt
import pytest

from deltabus import cli
from deltabus.push.ledger import PushLedger
from deltabus.push.outcome_ledger import OutcomeLedger
from deltabus.push.pool import PoolServer
from deltabus.push.request_builder import RequestBuilder
from deltabus.push.worker import Worker
from deltabus.registry import Registry
from deltabus.storage import open_engine
from tests.endpoints import Behaviour, Endpoint
from tests.leaks import Secrets

EMAIL = "pusher@local.iam.gserviceaccount.com"


class Everything(logging.Handler):
    """Keeps every record as a formatted line, traceback included."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def every_record():
    """Root at DEBUG, loggers with a level of their own lowered to DEBUG, and the handler also
    on loggers that do not propagate: every record of the run, whatever its level."""
    handler = Everything()
    root = logging.getLogger()
    saved = [(root, root.level)]
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    lonely = []
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger):
            if logger.level > logging.DEBUG:
                saved.append((logger, logger.level))
                logger.setLevel(logging.DEBUG)
            if not logger.propagate:
                logger.addHandler(handler)
                lonely.append(logger)
    logging.captureWarnings(True)
    try:
        yield handler
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        for logger in lonely:
            logger.removeHandler(handler)
        for logger, level in saved:
            logger.setLevel(level)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not predicate():
        time.sleep(0.02)
    return predicate()


def test_no_key_token_payload_or_secret_value_reaches_a_log(pub, psub, topic, warehouse, capfd, every_record):
    secrets = Secrets()
    tag = uuid.uuid4().hex
    payloads: list[bytes] = []

    def payload() -> bytes:
        data = f"SECRET-PAYLOAD-{tag}-{len(payloads)}".encode()
        secrets.add_payload(f"payload {len(payloads)}", data)
        payloads.append(data)
        return data

    attr = f"SECRET-ATTR-{tag}"
    query = f"SECRET-QUERY-{tag}"
    secrets.add("the secret attribute value", attr)
    secrets.add("the endpoints' query secret", query)
    printed: list[str] = []  # what subprocesses and in-process commands printed besides their output

    state = {"down": 503}
    with Endpoint() as ok, Endpoint(Behaviour(lambda r, n: (state["down"], 0.0))) as down:
        oidc = {"service_account_email": EMAIL}
        push = {
            "wrapped": {"push_endpoint": f"{ok.url}?key={query}", "oidc_token": oidc},
            "unwrapped": {"push_endpoint": ok.url, "oidc_token": {**oidc, "audience": "https://aud.example"},
                          "no_wrapper": {"write_metadata": True}},  # attributes become headers
            "down": {"push_endpoint": f"{down.url}?key={query}", "oidc_token": oidc},
            "refused": {"push_endpoint": f"http://127.0.0.1:{closed_port()}/push?key={query}", "oidc_token": oidc},
        }
        names = {k: psub.subscription_path("local", f"push-{k}") for k in push}
        for k, cfg in push.items():
            psub.create_subscription(name=names[k], topic=topic, push_config=cfg)
        pulled, streamed = (psub.subscription_path("local", n) for n in ("pulled", "streamed"))
        for s in (pulled, streamed):
            psub.create_subscription(name=s, topic=topic, ack_deadline_seconds=10)

        # -- publish: the CLI in a subprocess, then the client -----------------------------
        cli_data = payload().decode()
        out = subprocess.run([str(Path(sys.executable).parent / "deltabus"), "--warehouse", warehouse, "publish", topic, cli_data,
                              "--attribute", f"secret={attr}"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        printed += [out.stdout, out.stderr]
        ids = out.stdout.split()
        ids += pub.publish_batch(topic, [{"data": payload(), "attributes": {"secret": attr}, "ordering_key": "k" if i % 2 else ""}
                                         for i in range(6)])
        assert len(ids) == 7

        # -- pull: unary (nack, then ack), the CLI, and streaming --------------------------
        got = psub.pull(subscription=pulled, max_messages=3).received_messages
        psub.modify_ack_deadline(subscription=pulled, ack_ids=[r.ack_id for r in got], ack_deadline_seconds=0)  # nack
        got = psub.pull(subscription=pulled, max_messages=4).received_messages
        psub.acknowledge(subscription=pulled, ack_ids=[r.ack_id for r in got])
        pull_output = io.StringIO()  # the payloads the user asked to see: not a log
        assert cli.main(["--warehouse", warehouse, "pull", pulled, "--ack", "--max-messages", "10"], out=pull_output) == 0
        assert f"SECRET-PAYLOAD-{tag}" in pull_output.getvalue()  # it did print payloads, there
        received: list[str] = []

        def callback(message) -> None:
            received.append(message.message_id)
            message.ack()

        future = psub.subscribe(streamed, callback)
        try:
            assert wait_for(lambda: len(set(received)) == len(ids))
        finally:
            future.cancel()
            future.result(timeout=30)

        # -- push: tokens signed as the job signs them, sent by a real worker -------------
        engine = open_engine(warehouse, create=False)
        registry = Registry(engine, clock=time.time)
        builder = RequestBuilder(engine, keys_path=f"{warehouse}/_keys", issuer="https://deltabus.test", clock=time.time)
        book = OutcomeLedger(registry.subscriptions, clock=time.monotonic, rand=random.random)
        server = PoolServer(PushLedger(), per_sub=64)
        secrets.add("the pool's run key", server.key)
        worker = Worker(server.url, server.key)
        thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
        thread.start()
        issued: set[str] = set()
        try:
            for attempt in (1, 2, 3):
                if attempt == 3:
                    state["down"] = 204  # it recovers (its backoff ends after 5 s clean: not waited for)
                recs = registry.subscriptions()
                expected = 0
                for k in push:
                    rec = recs[names[k]]
                    requests = builder.build(rec, [(m, attempt) for m in ids], time.time())
                    issued.update(requests["token"].to_pylist())
                    server.ledger.submit(rec.sub_uid, requests)
                    expected += requests.num_rows
                server.notify()
                folded = 0
                end = time.monotonic() + 60
                while folded < expected and time.monotonic() < end:
                    f = book.fold(server.ledger.collect())
                    folded += f.acked + f.nacked
                    time.sleep(0.02)
                assert folded == expected
        finally:
            server.close()
            thread.join(30)
            server.stop()
        assert not thread.is_alive()

    # The tokens are real ones, and the endpoints got them.
    key_file = Path(warehouse) / "_keys" / "signing-key.pem"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    jwks = jwt.PyJWKSet.from_dict(json.loads((key_file.parent / "jwks.json").read_text()))
    assert len(issued) == 4 and None not in issued
    for token in issued:
        claims = jwt.decode(token, jwks.keys[0].key, algorithms=["RS256"], options={"verify_aud": False})
        assert claims["email"] == EMAIL
    bearer = {r.headers["Authorization"].removeprefix("Bearer ") for r in ok.snapshot() + down.snapshot()}
    assert len(bearer) == 3 and bearer <= issued  # all but the refused endpoint's
    for i, token in enumerate(sorted(issued)):
        secrets.add_token(f"token {i}", token)
    secrets.add_key_file(key_file)
    assert any(attr in r.headers.values() for r in ok.snapshot())  # the unwrapped pushes carried it, in a header

    # What was captured: every record, at every level, and all that was printed.
    printed += list(capfd.readouterr())
    lines = every_record.lines
    levels = {r.levelno for r in every_record.records if r.name.startswith("deltabus")}
    assert {logging.DEBUG, logging.INFO, logging.WARNING} <= levels, sorted(levels)
    text = "\n".join(lines)
    assert "backing off" in text and "http 503" in text and "connection refused" in text
    # The check itself finds what it looks for (a token, a payload's base64, a key line, a JWT shape).
    assert len(secrets.found(f"{sorted(issued)[0]} {json.dumps({'data': base64.b64encode(payloads[0]).decode()})}"
                             f" {key_file.read_text().splitlines()[3]}")) >= 5

    leaked = {where: secrets.found(t) for where, t in (("the log", text), ("what was printed", "\n".join(printed)))}
    assert not any(leaked.values()), leaked
