"""The deltabus console script, driven as a subprocess on a real warehouse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltabus import SubscriberClient
from tests.conftest import table_versions

SCRIPT = Path(sys.executable).with_name("deltabus")


def run(warehouse, *args, input=None, ok=True):
    env = {**os.environ, "DELTABUS_WAREHOUSE": warehouse, "DELTABUS_PROJECT": "cli"}
    p = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, input=input, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def test_help_everywhere(warehouse):
    for args in ([], ["topics"], ["topics", "create"], ["subscriptions"], ["subscriptions", "update"], ["publish"], ["pull"], ["backlog"], ["maintenance"]):
        p = run(warehouse, *args, "--help")
        assert "usage: deltabus" in p.stdout


def test_topics_and_subscriptions_lifecycle(warehouse):
    assert "created topic projects/cli/topics/orders" in run(warehouse, "topics", "create", "orders", "--label", "team=data").stdout
    assert "projects/cli/topics/orders" in run(warehouse, "topics", "list").stdout
    run(warehouse, "subscriptions", "create", "orders-pull", "--topic", "orders", "--ack-deadline", "30")
    p = run(warehouse, "subscriptions", "create", "orders-push", "--topic", "orders", "--push-endpoint", "https://example.com/push",
            "--oidc-service-account", "sa@cli.iam.gserviceaccount.com", "--no-wrapper", "--write-metadata")
    assert "created push subscription" in p.stdout
    got = json.loads(run(warehouse, "subscriptions", "get", "orders-push").stdout)
    assert got["push_endpoint"] == "https://example.com/push" and got["oidc_service_account"] == "sa@cli.iam.gserviceaccount.com"
    assert got["no_wrapper"] and got["write_metadata"]
    run(warehouse, "subscriptions", "update", "orders-push", "--pull", "--ack-deadline", "60")
    got = json.loads(run(warehouse, "subscriptions", "get", "orders-push").stdout)
    assert got["push_endpoint"] == "" and got["ack_deadline_seconds"] == 60
    listed = run(warehouse, "subscriptions", "list").stdout
    assert "projects/cli/subscriptions/orders-pull" in listed and "projects/cli/subscriptions/orders-push" in listed
    run(warehouse, "subscriptions", "delete", "orders-push")
    run(warehouse, "topics", "delete", "orders")
    assert "orders" not in run(warehouse, "topics", "list").stdout.split("\n", 2)[-1]


def test_publish_pull_ack_and_backlog(warehouse, tmp_path):
    run(warehouse, "topics", "create", "events")
    run(warehouse, "subscriptions", "create", "events-sub", "--topic", "events")
    ids = run(warehouse, "publish", "events", "one", "two", "--attribute", "src=cli").stdout.split()
    assert len(ids) == 2
    lines = tmp_path / "msgs.jsonl"
    with lines.open("w") as f:
        for i in range(12_000):
            f.write(json.dumps({"data": f"line {i}", "attributes": {"i": str(i)}}) + "\n")
        f.write(json.dumps({"data_base64": "AAEC", "ordering_key": "k"}) + "\n")
    p = run(warehouse, "publish", "events", "--file", str(lines))
    assert "published 12001 messages" in p.stdout
    assert "12001/12001" in p.stderr  # the progress bar
    table = run(warehouse, "backlog").stdout
    assert "projects/cli/subscriptions/events-sub" in table and "12003" in table
    pulled = run(warehouse, "pull", "events-sub", "--max-messages", "2", "--ack")
    msgs = [json.loads(l) for l in pulled.stdout.splitlines()]
    assert [m["data"] for m in msgs] == ["one", "two"] and msgs[0]["attributes"] == {"src": "cli"}
    sub = SubscriberClient(warehouse=warehouse)
    assert sub.get_backlog("projects/cli/subscriptions/events-sub").num_unacked_messages == 12001


@pytest.mark.parametrize(
    "args, words",
    [
        (["subscriptions", "create", "s-1", "--topic", "missing"], "topic not found"),
        (["topics", "create", "x"], "must match"),
        (["subscriptions", "create", "s-2", "--topic", "events", "--ack-deadline", "5"], "ack_deadline_seconds"),
        (["subscriptions", "create", "s-3", "--topic", "events", "--push-endpoint", "http://127.0.0.1:1/p"], "https"),
        (["publish", "events"], "give message data"),
        (["pull", "nothing-here"], "subscription not found"),
    ],
)
def test_errors_are_one_line_and_write_nothing(warehouse, args, words):
    run(warehouse, "topics", "create", "events")
    before = table_versions(warehouse)
    p = run(warehouse, *args, ok=False)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("deltabus: error:") and words in p.stderr
    assert table_versions(warehouse) == before


def test_bad_jsonl_line_publishes_nothing(warehouse, tmp_path):
    run(warehouse, "topics", "create", "events")
    f = tmp_path / "bad.jsonl"
    f.write_text('{"data": "fine"}\n{"data": "x", "colour": "red"}\n')
    before = table_versions(warehouse)
    p = run(warehouse, "publish", "events", "--file", str(f), ok=False)
    assert p.returncode == 1 and f"{f}:2" in p.stderr
    assert table_versions(warehouse) == before
