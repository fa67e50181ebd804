"""The deltabus console script, driven as a subprocess on a real warehouse."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deltabus import SubscriberClient, cli
from tests import background
from tests.conftest import table_versions

SCRIPT = Path(sys.executable).with_name("deltabus")


def run(warehouse, *args, input=None, ok=True):
    env = {**background.env(), "DELTABUS_WAREHOUSE": warehouse, "DELTABUS_PROJECT": "cli"}
    p = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, input=input, timeout=120)
    if ok:
        assert p.returncode == 0, p.stderr
    return p


def test_help_everywhere(warehouse, capsys):
    assert "usage: deltabus" in run(warehouse, "--help").stdout  # the console script itself
    from deltabus import cli

    # The parser's own help pages, in this process (a process each cost ~0.7 s).
    for args in (["init"], ["topics"], ["topics", "create"], ["topics", "update"], ["subscriptions"], ["subscriptions", "update"],
                 ["snapshots"], ["snapshots", "create"], ["seek"], ["publish"], ["pull"], ["backlog"], ["maintenance"]):
        assert cli.main([*args, "--help"]) == 0
        assert "usage: deltabus" in capsys.readouterr().out, args


def topics_and_subscriptions_lifecycle(warehouse):
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


def publish_pull_ack_and_backlog(warehouse, tmp_path):
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
    sub.close()


@pytest.mark.parametrize(
    "args, words",
    [
        (["subscriptions", "create", "s-1", "--topic", "missing"], "topic not found"),
        (["topics", "create", "x"], "must match"),
        (["subscriptions", "create", "s-2", "--topic", "events", "--ack-deadline", "5"], "--ack-deadline: must be between 10 and 600"),
        (["subscriptions", "create", "s-3", "--topic", "events", "--push-endpoint", "http://127.0.0.1:1/p"], "https; add --allow-http"),
        (["publish", "events"], "give message data"),
        (["pull", "nothing-here"], "subscription not found"),
        (["seek", "events-sub", "--time", "yesterday"], "--time: must be an RFC 3339 time such as 2026-11-26T12:00:00Z, or a duration back"),
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


# -- in-process runs (the same main() the console script calls) -----------------------------
def deltabus(capsys, warehouse, *argv, code=0):
    """Run the CLI in this process; return (stdout, stderr) after checking its exit code."""
    got = cli.main(["--warehouse", warehouse, *argv], environ={"DELTABUS_PROJECT": "cli", "DELTABUS_ENGINE": "delta-rs"})
    cap = capsys.readouterr()
    assert got == code, cap.err
    if code:
        assert cap.err.count("\n") == 1 and cap.err.startswith("deltabus: error: "), cap.err
    return cap.out, cap.err


def global_options_before_the_command_are_used(tmp_path):
    """`deltabus --warehouse W topics list` ran against ./warehouse."""
    env = {k: v for k, v in background.env().items() if k not in ("DELTABUS_WAREHOUSE", "DELTABUS_PROJECT")}
    w = str(tmp_path / "w")
    run_ = lambda *a: subprocess.run([str(SCRIPT), *a], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run_("--warehouse", w, "--project", "p1", "topics", "create", "orders").returncode == 0
    assert "projects/p1/topics/orders" in run_("--warehouse", w, "--project", "p1", "topics", "list").stdout
    assert "projects/p1/topics/orders" in run_("topics", "list", "--project", "p1", "--warehouse", w).stdout
    assert "projects/p1/topics/orders" not in run_("--warehouse", w, "topics", "list").stdout  # project "local"
    assert not (tmp_path / "warehouse").exists()


# The console script's runs (~1 s each, ~23 s for these three) in the background from the
# session's first test on (tests/background.py).
BACKGROUND = {
    "test_topics_and_subscriptions_lifecycle": lambda tmp: topics_and_subscriptions_lifecycle(str(tmp / "warehouse")),
    "test_publish_pull_ack_and_backlog": lambda tmp: publish_pull_ack_and_backlog(str(tmp / "warehouse"), tmp),
    "test_global_options_before_the_command_are_used": global_options_before_the_command_are_used,
}


def test_topics_and_subscriptions_lifecycle(early_background):
    early_background.result("test_topics_and_subscriptions_lifecycle")


def test_publish_pull_ack_and_backlog(early_background):
    early_background.result("test_publish_pull_ack_and_backlog")


def test_global_options_before_the_command_are_used(early_background):
    early_background.result("test_global_options_before_the_command_are_used")


READS = [
    ["topics", "list"], ["topics", "delete", "orders"],
    ["subscriptions", "list"], ["subscriptions", "get", "orders-sub"], ["subscriptions", "delete", "orders-sub"],
    ["subscriptions", "update", "orders-sub", "--ack-deadline", "20"],
    ["subscriptions", "create", "orders-sub", "--topic", "orders"],
    ["publish", "orders", "hello"], ["pull", "orders-sub"], ["backlog"], ["maintenance"],
    ["topics", "get", "orders"], ["topics", "update", "orders", "--retention", "1d"],
    ["seek", "orders-sub", "--time", "-1h"], ["seek", "orders-sub", "--snapshot", "snap-1"],
    ["snapshots", "list"], ["snapshots", "get", "snap-1"], ["snapshots", "create", "snap-1", "--subscription", "orders-sub"],
    ["snapshots", "update", "snap-1", "--label", "k=v"], ["snapshots", "delete", "snap-1"],
]


@pytest.mark.parametrize("argv", READS, ids=lambda a: " ".join(a[:2]))
def test_a_mistyped_warehouse_is_no_warehouse_and_creates_nothing(capsys, tmp_path, argv):
    typo = str(tmp_path / "wharehouse")
    _, err = deltabus(capsys, typo, *argv, code=1)
    assert f"no warehouse at {typo}" in err and "deltabus init" in err
    assert not os.path.exists(typo)


def test_publish_file_on_a_missing_warehouse_creates_nothing(capsys, tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"data": "x"}\n')
    typo = str(tmp_path / "typo")
    _, err = deltabus(capsys, typo, "publish", "orders", "--file", str(f), code=1)
    assert f"no warehouse at {typo}" in err and not os.path.exists(typo)


def test_init_and_topics_create_make_the_warehouse(capsys, tmp_path):
    w = str(tmp_path / "a")
    out, _ = deltabus(capsys, w, "init")
    assert "created warehouse at" in out and set(table_versions(w)) >= {"topics", "messages"}
    assert "warehouse already at" in deltabus(capsys, w, "init")[0]
    w2 = str(tmp_path / "b")
    deltabus(capsys, w2, "topics", "create", "orders")
    assert "projects/cli/topics/orders" in deltabus(capsys, w2, "topics", "list")[0]
    deltabus(capsys, str(tmp_path / "c"), "topics", "create", "x", code=1)  # a bad name creates nothing
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("argv", [["topics", "list"], ["topics", "create", "orders"], ["init"], ["maintenance"]])
def test_a_warehouse_that_is_a_file_is_one_line_naming_the_flag(capsys, tmp_path, argv):
    f = tmp_path / "afile"
    f.write_text("x")
    for path in (str(f), str(f / "under")):
        _, err = deltabus(capsys, path, *argv, code=1)
        assert err.startswith("deltabus: error: --warehouse: must be a directory") and str(f) in err and "Errno" not in err
    assert f.read_text() == "x"


@pytest.fixture
def events(capsys, warehouse):
    deltabus(capsys, warehouse, "topics", "create", "events")
    deltabus(capsys, warehouse, "subscriptions", "create", "events-sub", "--topic", "events")
    return warehouse


def pull_all(capsys, warehouse):
    out, _ = deltabus(capsys, warehouse, "pull", "events-sub", "--max-messages", "100", "--ack")
    return [json.loads(line) for line in out.splitlines()]


def test_publish_file_stores_objects_as_compact_json_and_text_as_is(capsys, events, tmp_path):
    f = tmp_path / "e.jsonl"
    f.write_text("\n".join([
        json.dumps({"data": {"order": 1, "items": ["é"]}}),
        json.dumps({"data": [1, 2]}),
        json.dumps({"data": "plain", "attributes": {"k": "v"}, "ordering_key": "o"}),
        json.dumps({"data_base64": base64.b64encode(b"\xff\x00").decode()}),
    ]) + "\n", encoding="utf-8")
    out, _ = deltabus(capsys, events, "publish", "events", "--file", str(f), "--attribute", "src=cli")
    assert "published 4 messages" in out
    got = pull_all(capsys, events)
    assert [m.get("data", m.get("data_base64")) for m in got] == ['{"order":1,"items":["é"]}', "[1,2]", "plain", "/wA="]
    assert got[2]["attributes"] == {"src": "cli", "k": "v"} and got[2]["ordering_key"] == "o"


@pytest.mark.parametrize(
    "bad, words",
    [
        ('{"data": {"order": 1}, "attributes": ["a", "b"]}', ":3: attributes: must be an object of string values"),
        ('{"data": "x", "attributes": {"n": 1}}', ":3: attributes: must be an object of string values"),
        ('{"data": null}', ":3: data: must be a string, or an object or array"),
        ('{"data": 42}', ":3: data: must be a string, or an object or array"),
        ('{"data_base64": "%%%"}', ":3: data_base64: must be standard base64"),
        ('{"data": "x", "colour": "red"}', ":3: colour: unknown field"),
        ('{"data": "x",', ":3: not valid JSON"),
    ],
)
def test_any_bad_line_is_named_and_publishes_nothing(capsys, events, tmp_path, bad, words):
    f = tmp_path / "events.jsonl"
    f.write_text('{"data": "fine"}\n\n' + bad + '\n{"data": "after"}\n')
    before = table_versions(events)
    _, err = deltabus(capsys, events, "publish", "events", "--file", str(f), code=1)
    assert f"{f}{words}" in err and "Traceback" not in err
    assert table_versions(events) == before


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--push-endpoint", "https://exa mple.com/push"], "--push-endpoint: must not contain whitespace"),
        (["--push-endpoint", "https://example.com:99999/push"], "--push-endpoint: the port must be a number 1..65535"),
        (["--push-endpoint", "https://u:secret@example.com/push"], "--push-endpoint: must not carry user:password@"),
        (["--push-endpoint", "https://example.com/push", "--write-metadata"], "--write-metadata: needs --no-wrapper"),
        (["--push-endpoint", "https://example.com/push", "--oidc-audience", "a"], "--oidc-audience: needs --oidc-service-account"),
        (["--no-wrapper"], "--no-wrapper: needs --push-endpoint"),
        (["--push-endpoint", "http://127.0.0.1:9/push"], "--push-endpoint: must be https; add --allow-http"),
        (["--ack-deadline", "5"], "--ack-deadline: must be between 10 and 600"),
        (["--label", "team"], "--label: expected KEY=VALUE"),
        (["--label", "Team=x"], "--label 'Team': keys are"),
    ],
)
def test_bad_subscription_flags_name_the_flag_and_write_nothing(capsys, events, argv, words):
    before = table_versions(events)
    for cmd in (["create", "new-sub", "--topic", "events"], ["update", "events-sub"]):
        _, err = deltabus(capsys, events, "subscriptions", *cmd, *argv, code=1)
        assert words in err and "secret" not in err
    assert table_versions(events) == before


def test_allow_http_flag_and_pull_with_push_options(capsys, events):
    deltabus(capsys, events, "subscriptions", "create", "local-push", "--topic", "events", "--push-endpoint", "http://127.0.0.1:9/p", "--allow-http")
    deltabus(capsys, events, "subscriptions", "update", "local-push", "--push-endpoint", "http://127.0.0.1:8/p", "--allow-http")
    assert json.loads(deltabus(capsys, events, "subscriptions", "get", "local-push")[0])["push_endpoint"] == "http://127.0.0.1:8/p"
    _, err = deltabus(capsys, events, "subscriptions", "update", "local-push", "--pull", "--no-wrapper", code=1)
    assert "--no-wrapper: needs --push-endpoint" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["pull", "events-sub", "--max-messages", "0"], "--max-messages: must be an integer 1..10000"),
        (["pull", "missing-sub"], "subscription not found: projects/cli/subscriptions/missing-sub"),
        (["publish", "events", "--attribute", "k"], "--attribute: expected KEY=VALUE"),
        (["publish", "events", "x", "--attribute", "googk=v"], "--attribute 'googk': keys starting with 'goog' are reserved"),
        (["publish", "events", ""], "DATA 1: a message needs non-empty data or at least one attribute"),
        (["publish", "events", "x", "--file", "-"], "--file: give message data as arguments or with --file, not both"),
        (["publish", "events", "--file", "/nonexistent/e.jsonl"], "--file: cannot read /nonexistent/e.jsonl: No such file"),
        (["maintenance", "--retention-hours", "-1"], "--retention-hours: must be >= 0"),
        (["maintenance", "--history-retention-days", "-1"], "--history-retention-days: must be >= 0"),
        (["--project", "9x", "topics", "list"], "--project: project id '9x' must match"),
        (["subscriptions", "update", "events-sub"], "nothing to change"),
        (["seek", "events-sub", "--time", "soon"], "--time: must be an RFC 3339 time such as 2026-11-26T12:00:00Z, or a duration back "
                                                   "from now such as -1h, -30m or -2d, got 'soon'"),
        (["seek", "events-sub", "--time", "-2w"], "--time: must be an RFC 3339 time"),
        (["seek", "events-sub", "--time", "-1x"], "--time: must be an RFC 3339 time"),
        (["seek", "events-sub", "--time", "2026-13-01T00:00:00Z"], "--time: must be an RFC 3339 time"),
        (["seek", "events-sub", "--snapshot", "missing-snap"], "snapshot not found: projects/cli/snapshots/missing-snap"),
        (["seek", "events-sub", "--snapshot", "x"], "--snapshot: id 'x' must match"),
        (["seek", "missing-sub", "--time", "-1h"], "subscription not found: projects/cli/subscriptions/missing-sub"),
        (["snapshots", "create", "snap-1", "--subscription", "missing-sub"], "subscription not found"),
        (["snapshots", "create", "snap-1", "--subscription", "events-sub", "--label", "Team=x"], "--label 'Team': keys are"),
        (["snapshots", "create", "x", "--subscription", "events-sub"], "SNAPSHOT: id 'x' must match"),
        (["snapshots", "get", "missing-snap"], "snapshot not found: projects/cli/snapshots/missing-snap"),
        (["snapshots", "update", "missing-snap", "--label", "k=v"], "snapshot not found"),
        (["snapshots", "delete", "missing-snap"], "snapshot not found"),
        (["topics", "create", "longer", "--retention", "40d"], "--retention: must be 10 minutes..31 days"),
        (["topics", "update", "events", "--retention", "5m"], "--retention: must be 10 minutes..31 days"),
        (["topics", "update", "events", "--label", "Team=x"], "--label 'Team': keys are"),
        (["topics", "update", "events"], "nothing to change: give --label, --retention or --no-retention"),
        (["topics", "get", "missing-topic"], "topic not found: projects/cli/topics/missing-topic"),
        (["subscriptions", "create", "kept", "--topic", "events", "--retention", "8d"], "--retention: must be 10 minutes..7 days"),
    ],
)
def test_other_commands_name_the_bad_argument(capsys, events, argv, words):
    before = table_versions(events)
    _, err = deltabus(capsys, events, *argv, code=1)
    assert words in err
    assert table_versions(events) == before


def test_data_given_after_options(capsys, events):
    deltabus(capsys, events, "publish", "events", "one", "--attribute", "k=v", "two")
    assert [(m["data"], m["attributes"]) for m in pull_all(capsys, events)] == [("one", {"k": "v"}), ("two", {"k": "v"})]


def test_ctrl_c_during_publish_stops_between_commits_and_says_what_was_published(warehouse, tmp_path):
    run(warehouse, "topics", "create", "events")
    run(warehouse, "subscriptions", "create", "events-sub", "--topic", "events")
    total = 100_000
    f = tmp_path / "big.jsonl"
    f.write_text("".join(f'{{"data": "m{i}"}}\n' for i in range(total)))
    env = {**os.environ, "DELTABUS_WAREHOUSE": warehouse, "DELTABUS_PROJECT": "cli"}
    p = subprocess.Popen([str(SCRIPT), "publish", "events", "--file", str(f)], stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    err = bytearray()
    reader = threading.Thread(target=lambda: [err.extend(c) for c in iter(lambda: p.stderr.read1(4096), b"")], daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not re.search(rb"[1-9]\d*/100000", bytes(err)) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    reader.join(timeout=10)
    last = bytes(err).decode().replace("\r", "\n").strip().splitlines()[-1]
    m = re.fullmatch(rf"deltabus: interrupted: published (\d+) of {total} messages \(lines 1-(\d+) of {re.escape(str(f))}\); the rest were not published", last)
    assert m, last
    done = int(m.group(1))
    assert 0 < done < total and done % 1000 == 0 and int(m.group(2)) == done
    sub = SubscriberClient(warehouse=warehouse)
    assert sub.get_backlog("projects/cli/subscriptions/events-sub").num_unacked_messages == done  # exactly what it said


@pytest.mark.parametrize("filename", ["topic.jsonl", "warehouse.jsonl", "project.v1.jsonl"])
def test_a_file_named_like_a_flag_is_still_named_with_its_line(capsys, events, tmp_path, monkeypatch, filename):
    (tmp_path / filename).write_text('{"data": "fine"}\n{"attributes": ["a", "b"]}\n')
    monkeypatch.chdir(tmp_path)  # a relative name, as typed: "topic.jsonl:2: ..." once looked like the flag TOPIC
    before = table_versions(events)
    _, err = deltabus(capsys, events, "publish", "events", "--file", filename, code=1)
    assert err.strip() == f"deltabus: error: {filename}:2: attributes: must be an object of string values, got an array"
    assert table_versions(events) == before


# -- seek and snapshots (issue 15) -------------------------------------------------------------
def test_seek_back_in_time_replays_acked_messages_with_retain_acked(capsys, events):
    """`--time -1h` is a value (not an unknown option); only the subscription that keeps
    acked messages gets them back (the topic keeps none)."""
    deltabus(capsys, events, "subscriptions", "create", "kept-sub", "--topic", "events", "--retain-acked", "--retention", "1d")
    got = json.loads(deltabus(capsys, events, "subscriptions", "get", "kept-sub")[0])
    assert (got["retain_acked_messages"], got["message_retention_duration"]) == (True, 86400.0)
    deltabus(capsys, events, "publish", "events", "one", "two")
    for name in ("kept-sub", "events-sub"):
        assert len(deltabus(capsys, events, "pull", name, "--ack")[0].splitlines()) == 2
        out, _ = deltabus(capsys, events, "seek", name, "--time", "-1h")
        assert re.fullmatch(rf"seeked projects/cli/subscriptions/{name} to \d{{4}}-\d\d-\d\dT[\d:.]+Z "
                            r"\(messages published before it count as acked\)\n", out), out
    again = [json.loads(l)["data"] for l in deltabus(capsys, events, "pull", "kept-sub", "--ack")[0].splitlines()]
    assert sorted(again) == ["one", "two"]
    assert deltabus(capsys, events, "pull", "events-sub")[0] == ""  # acked and not retained: gone
    # Back again, then forward past them (an RFC 3339 time): both count as acked again.
    deltabus(capsys, events, "seek", "kept-sub", "--time=-30m")
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    assert f"to {future} " in deltabus(capsys, events, "seek", "kept-sub", "--time", future)[0]
    assert deltabus(capsys, events, "pull", "kept-sub")[0] == ""


def test_seek_to_a_snapshot_short_or_full_name(capsys, events):
    deltabus(capsys, events, "publish", "events", "one", "two")
    deltabus(capsys, events, "pull", "events-sub", "--max-messages", "1", "--ack")  # "one" acked, "two" unacked
    out, _ = deltabus(capsys, events, "snapshots", "create", "before-two", "--subscription", "events-sub")
    assert out.startswith("created snapshot projects/cli/snapshots/before-two of projects/cli/subscriptions/events-sub (expires 20")
    deltabus(capsys, events, "publish", "events", "three")
    assert [m["data"] for m in pull_all(capsys, events)] == ["two", "three"]
    for snap in ("before-two", "projects/cli/snapshots/before-two"):
        out, _ = deltabus(capsys, events, "seek", "events-sub", "--snapshot", snap)
        assert out.startswith("seeked projects/cli/subscriptions/events-sub to snapshot projects/cli/snapshots/before-two")
        assert [m["data"] for m in pull_all(capsys, events)] == ["two", "three"]  # unacked at the snapshot, and every later one


def test_snapshots_create_list_get_update_delete(capsys, events):
    deltabus(capsys, events, "publish", "events", "one")
    deltabus(capsys, events, "snapshots", "create", "snap-a", "--subscription", "events-sub", "--label", "team=data", "--label", "env=dev")
    deltabus(capsys, events, "snapshots", "create", "projects/cli/snapshots/snap-b", "--subscription", "projects/cli/subscriptions/events-sub")
    got = json.loads(deltabus(capsys, events, "snapshots", "get", "snap-a")[0])
    assert got["name"] == "projects/cli/snapshots/snap-a" and got["topic"] == "projects/cli/topics/events"
    assert got["labels"] == {"team": "data", "env": "dev"} and got["expire_time"].endswith("Z")
    header, rule, *rows = deltabus(capsys, events, "snapshots", "list")[0].splitlines()
    assert header.split() == ["name", "topic", "expire_time", "labels"]
    assert [r.split()[0] for r in rows] == ["projects/cli/snapshots/snap-a", "projects/cli/snapshots/snap-b"]
    assert rows[0].split()[-1] == "team=data,env=dev"
    assert "snap-a" not in deltabus(capsys, events, "--project", "other-project", "snapshots", "list")[0]

    out, _ = deltabus(capsys, events, "snapshots", "update", "snap-a", "--label", "team=ops")
    assert out == "updated projects/cli/snapshots/snap-a: labels\n"
    assert json.loads(deltabus(capsys, events, "snapshots", "get", "snap-a")[0])["labels"] == {"team": "ops"}  # replaced
    _, err = deltabus(capsys, events, "snapshots", "create", "snap-a", "--subscription", "events-sub", code=1)
    assert "already exists" in err

    assert deltabus(capsys, events, "snapshots", "delete", "snap-a")[0] == "deleted snapshot projects/cli/snapshots/snap-a\n"
    deltabus(capsys, events, "snapshots", "get", "snap-a", code=1)
    rows = deltabus(capsys, events, "snapshots", "list")[0].splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["projects/cli/snapshots/snap-b"]


def test_topic_retention_create_get_list_update(capsys, warehouse):
    out, _ = deltabus(capsys, warehouse, "topics", "create", "kept", "--retention", "2d", "--label", "team=data")
    assert out == "created topic projects/cli/topics/kept (keeps messages 2d)\n"
    deltabus(capsys, warehouse, "topics", "create", "plain")
    got = json.loads(deltabus(capsys, warehouse, "topics", "get", "kept")[0])
    assert got == {"name": "projects/cli/topics/kept", "labels": {"team": "data"}, "message_retention_duration": 172800.0}
    assert json.loads(deltabus(capsys, warehouse, "topics", "get", "plain")[0])["message_retention_duration"] is None

    def listed() -> dict[str, list[str]]:
        header, _, *rows = deltabus(capsys, warehouse, "topics", "list")[0].splitlines()
        assert header.split() == ["name", "labels", "retention"]
        return {r.split()[0]: r.split()[1:] for r in rows}

    assert listed() == {"projects/cli/topics/kept": ["team=data", "2d"], "projects/cli/topics/plain": []}
    assert deltabus(capsys, warehouse, "topics", "update", "plain", "--retention", "36h")[0] == \
        "updated projects/cli/topics/plain: message_retention_duration\n"
    deltabus(capsys, warehouse, "topics", "update", "kept", "--no-retention", "--label", "team=ops")
    assert listed() == {"projects/cli/topics/kept": ["team=ops"], "projects/cli/topics/plain": ["36h"]}
    assert json.loads(deltabus(capsys, warehouse, "topics", "get", "kept")[0])["message_retention_duration"] is None
