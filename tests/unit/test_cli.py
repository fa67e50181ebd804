"""The command line's parser: global options in either place, and argparse's errors as one line, exit 1."""

from __future__ import annotations

import pytest

from deltabus import cli
from deltabus.errors import InvalidArgument


def parse(*argv: str, environ: dict[str, str] | None = None):
    args = cli.build_parser().parse_args(list(argv))
    cli._resolve_globals(args, environ or {})
    return args


@pytest.mark.parametrize(
    "argv",
    [
        ["--warehouse", "W", "--project", "P", "topics", "list"],
        ["topics", "--warehouse", "W", "--project", "P", "list"],
        ["topics", "list", "--warehouse", "W", "--project", "P"],
        ["--warehouse", "W", "topics", "list", "--project", "P"],
        ["--warehouse=W", "pull", "sub-1", "--project=P"],
        ["--project", "P", "subscriptions", "update", "sub-1", "--ack-deadline", "20", "--warehouse", "W"],
    ],
)
def test_global_options_before_or_after_the_command(argv):
    args = parse(*argv, environ={"DELTABUS_WAREHOUSE": "from-env", "DELTABUS_PROJECT": "env-project"})
    assert (args.warehouse, args.project) == ("W", "P")


def test_environment_then_default():
    args = parse("topics", "list", environ={"DELTABUS_WAREHOUSE": "from-env", "DELTABUS_PROJECT": "envp"})
    assert (args.warehouse, args.project, args.warehouse_source) == ("from-env", "envp", "$DELTABUS_WAREHOUSE")
    args = parse("topics", "list")
    assert (args.warehouse, args.project) == ("./warehouse", "local")


def test_the_later_of_two_placements_wins():
    assert parse("--warehouse", "A", "backlog", "--warehouse", "B").warehouse == "B"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bogus"], "argument COMMAND: invalid choice: 'bogus'"),
        ([], "the following arguments are required: COMMAND"),
        (["topics", "list", "--bogus"], "unrecognized arguments: --bogus"),
        (["topics"], "the following arguments are required: ACTION"),
        (["pull"], "the following arguments are required: SUBSCRIPTION"),
        (["subscriptions", "create", "sub-1"], "the following arguments are required: --topic"),
        (["pull", "sub-1", "--max-messages", "abc"], "argument --max-messages: invalid int value: 'abc'"),
        (["pull", "sub-1", "--wait", "-1"], "argument --wait: must be a finite number of seconds >= 0"),
        (["pull", "sub-1", "--wait", "nan"], "argument --wait: must be a finite number of seconds >= 0"),
        (["subscriptions", "create", "sub-1", "--topic", "t-1", "--ack-deadline", "ten"], "argument --ack-deadline: invalid int value"),
        (["subscriptions", "update", "sub-1", "--pull", "--push-endpoint", "https://example.com/p"], "not allowed with argument --pull"),
        (["publish", "t-1", "a", "--bogus", "b"], "unrecognized arguments: --bogus b"),
        (["seek", "sub-1"], "one of the arguments --time --snapshot is required"),
        (["seek", "sub-1", "--time", "-1h", "--snapshot", "snap-1"], "argument --snapshot: not allowed with argument --time"),
        (["snapshots", "create", "snap-1"], "the following arguments are required: --subscription"),
        (["snapshots", "update", "snap-1"], "the following arguments are required: --label"),
        (["topics", "create", "t-1", "--retention", "soon"], "argument --retention: must be a duration such as 7d"),
        (["topics", "update", "t-1", "--retention", "1d", "--no-retention"], "argument --no-retention: not allowed with argument --retention"),
    ],
)
def test_usage_errors_are_one_line_and_exit_1(capsys, argv, words):
    assert cli.main(argv, environ={}) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and cap.err.startswith("deltabus: error: ") and words in cap.err
    assert "--help" in cap.err  # says where to look, in place of argparse's usage block


@pytest.mark.parametrize("argv", [["--help"], ["topics", "--help"], ["publish", "-h"], ["subscriptions", "update", "--help"],
                                  ["seek", "--help"], ["snapshots", "update", "--help"], ["topics", "update", "--help"]])
def test_help_exits_0(capsys, argv):
    assert cli.main(argv, environ={}) == 0
    assert capsys.readouterr().out.startswith("usage: deltabus")


def test_publish_help_documents_the_jsonl_rule(capsys):
    cli.main(["publish", "--help"], environ={})
    out = capsys.readouterr().out
    for words in ('"data_base64"', "compact JSON", "null, a number or a boolean", "FILE:LINE", "before anything is published"):
        assert words in out


def test_data_after_options_is_still_data():
    args = cli.build_parser().parse_known_args(["publish", "t-1", "a", "--attribute", "k=v", "b"])
    assert args[0].data == ["a"] and args[1] == ["b"]  # main() appends the rest (covered in the integration test)


def test_flag_names_of_api_fields():
    flags = {"labels": "--label", "subscription.ack_deadline_seconds": "--ack-deadline", "push_config": "--push-endpoint",
             "push_config.oidc_token.audience": "--oidc-audience"}
    assert cli._flag("labels['BAD']", flags) == "--label 'BAD'"
    assert cli._flag("subscription.ack_deadline_seconds", flags) == "--ack-deadline"
    assert cli._flag("push_config.oidc_token.audience", flags) == "--oidc-audience"
    assert cli._flag("push_config.attributes", flags) == "--push-endpoint"
    assert cli._flag("topic", flags) == "topic"


@pytest.mark.parametrize("value", ["-1h", "-30m", "-2d", "-90", "-1.5h", "-.5d"])
def test_seek_takes_a_relative_time_that_starts_with_a_dash(value):
    assert parse("seek", "sub-1", "--time", value).time == value


def test_seek_time_is_rfc3339_or_a_duration_back_from_now():
    now = 1_800_000_000.0
    assert cli._seek_time("-1h", now) == now - 3600
    assert cli._seek_time("-30m", now) == now - 1800
    assert cli._seek_time("-2d", now) == now - 2 * 86400
    assert cli._seek_time("-0", now) == now
    assert cli._seek_time("2027-01-15T08:00:00Z", now) == 1_800_000_000.0
    assert cli._seek_time("2026-11-26T12:00:00+01:00", now) == cli._seek_time("2026-11-26T11:00:00Z", now)
    for bad in ("soon", "1h", "-", "-1w", "-inf", "-nan", "--1h", "2026-13-01T00:00:00Z"):
        with pytest.raises(InvalidArgument) as e:
            cli._seek_time(bad, now)
        assert e.value.field == "--time" and "duration back from now such as -1h" in str(e.value)


def test_delta_export_flags_build_the_delta_config():
    args = parse("subscriptions", "create", "exp", "--topic", "top", "--delta-table", "/d/t", "--delta-write-metadata")
    assert cli._delta_config(args) == {"delta_config": {"table": "/d/t", "write_metadata": True, "drop_unknown_fields": False}}
    assert cli._delta_config(parse("subscriptions", "create", "exp", "--topic", "top")) == {}
    assert cli._delta_config(parse("subscriptions", "update", "exp", "--clear-delta-export")) == {"delta_config": None}


@pytest.mark.parametrize(
    "argv, field",
    [
        (("subscriptions", "create", "exp", "--topic", "top", "--delta-write-metadata"), "--delta-write-metadata"),
        (("subscriptions", "create", "exp", "--topic", "top", "--delta-table", "rel/t"), "delta_config.table"),
        (("subscriptions", "update", "exp", "--clear-delta-export", "--delta-table", "/t"), "--clear-delta-export"),
    ],
)
def test_bad_delta_export_flags_are_refused_before_anything_opens(argv, field):
    with pytest.raises(InvalidArgument) as e:
        cli._delta_config(parse(*argv))
    assert e.value.field == field
