"""The chaos suite's scenarios, small (issue 16): the same harness as ./bench/chaos.sh
(bench/chaos.py), with invariants checked from the endpoint's and the clients' own records.

Both scenarios run in the background from the session's first test on (tests/background.py):
each mostly waits (Spark starting, leases running out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import chaos
from bench.chaos import ConcurrentSettings, KillSettings, concurrent, kills, summary
from tests import background
from bench.chaos_endpoint import ChaosEndpoint, EndpointSettings
from tests.leaks import Secrets


def quiet(tmp: Path) -> None:
    """The harness's lines to a file, and its processes the environment as the session began:
    it runs beside other tests (tests/background.py), which capture stdout and change os.environ."""
    chaos.Io.log = open(tmp / "harness.log", "a", buffering=1)
    chaos.Io.env = background.env()


def job_kills_under_the_failing_endpoint_mix(tmp: Path) -> None:
    quiet(tmp)
    # Every behaviour of the mix; one kill of a push worker alone (the job lives on), then of
    # the whole job; the last run on a damaged (truncated) streaming checkpoint. Fewer 500s
    # than the bench's 50%: the subscription's push backoff makes those the run's long tail
    # (600 messages took ~100 s at 50%).
    r = kills(tmp, KillSettings(messages=600, kills=1, failing_messages=50, min_gap=1.5, max_gap=3.0, refuse_seconds=8.0,
                                kill_worker_every=1, flaky_odds=0.2, finish_timeout=240.0))
    chaos.log(summary("kills", r))
    # No secret in the log of every run of the job: the signing key, the tokens the endpoint
    # was sent, the payloads (the harness publishes b"k" * 64).
    secrets = Secrets()
    secrets.add_key_file(tmp / "warehouse" / "_keys" / "signing-key.pem")
    tokens = ChaosEndpoint(tmp / "endpoint", EndpointSettings(deadline=1.0)).tokens()
    assert tokens and all(t.startswith("eyJ") for t in tokens)
    for i, token in enumerate(sorted(tokens)):
        secrets.add_token(f"token {i}", token)
    secrets.add_payload("the payload", b"k" * 64)
    assert not secrets.found((tmp / "deliver.log").read_text(errors="replace"))
    assert r["kills"] >= 2, r["kill_log"]  # a push worker kill and a job kill
    worker_kills = [k for k in r["kill_log"] if k["what"] == "push worker"]
    assert worker_kills and all(k["job_survived"] for k in worker_kills), r["kill_log"]
    for kind, f in r["subscriptions"].items():
        assert f["lost"] == 0, (kind, f)
        assert f["acked_then_redelivered"] == 0, (kind, f["violations"])
        assert f["backlog_agrees"] and f["backlog_unacked"] == 0, (kind, f)
        assert f["unknown_ids"] == 0, (kind, f)
    assert r["subscriptions"]["flaky"]["arrivals"] > r["subscriptions"]["flaky"]["published"]  # the 500s were retried
    # Nothing got through a failing TLS handshake or a refused connection; all came later.
    assert r["tls_fixed_at"] is not None and r["subscriptions"]["tls"]["first_arrival"] > r["tls_fixed_at"]
    assert r["subscriptions"]["refuse"]["first_arrival"] >= r["refuse_until"]
    assert r["unexpected"] == 0, r["unexpected_lines"]
    # The last run's checkpoint was truncated: set aside, a new one started, whose batches are its own.
    assert r["checkpoint_damage"] and r["checkpoint_set_aside"] and r["final_run_skipped_batches"] == 0, r["checkpoint_damage"]
    assert r["ok"]


def concurrent_clients_with_kills(tmp: Path) -> None:
    quiet(tmp)
    # Beside the push job (a push subscription of the same topic), not killed here: the
    # scenario above kills it; this one checks pushes and pulls share the tables unharmed.
    r = concurrent(tmp, ConcurrentSettings(processes=5, seconds=12.0, kill_every=2.0, lease_cap=10, job_kill_every=None))
    chaos.log(summary("concurrent", r))
    push = r["push"]
    assert push["published"] > 0 and push["acked"] == push["published"]
    assert (push["lost"], push["acked_then_redelivered"], push["backlog_unacked"]) == (0, 0, 0), push
    assert push["unexpected"] == 0, push["unexpected_lines"]
    # No secret in the job's log: the signing key and the tokens the endpoint was sent.
    secrets = Secrets()
    secrets.add_key_file(tmp / "warehouse" / "_keys" / "signing-key.pem")
    tokens = ChaosEndpoint(tmp / "endpoint", EndpointSettings(deadline=1.0)).tokens()
    assert tokens
    for i, token in enumerate(sorted(tokens)):
        secrets.add_token(f"token {i}", token)
    assert not secrets.found((tmp / "deliver.log").read_text(errors="replace"))
    assert r["kills"] >= 3 and r["cut_ack_calls"] <= r["kills"]
    assert r["published"] > 0 and r["receipts"] >= r["published"]
    assert (r["lost"], r["granted_twice"], r["acked_then_redelivered"]) == (0, 0, 0), r["violations"]
    assert r["unexpected_exceptions"] == 0
    assert r["backlog_left"] == 0 and r["unknown_ids"] >= 0
    assert r["ok"]


SCENARIOS = {
    "test_job_kills_under_the_failing_endpoint_mix": job_kills_under_the_failing_endpoint_mix,
    "test_concurrent_clients_with_kills": concurrent_clients_with_kills,
}


BACKGROUND = SCENARIOS  # started by the session's first test (tests/background.py)


@pytest.mark.spark
def test_job_kills_under_the_failing_endpoint_mix(early_background):
    early_background.result("test_job_kills_under_the_failing_endpoint_mix")


def test_concurrent_clients_with_kills(early_background):
    early_background.result("test_concurrent_clients_with_kills")
