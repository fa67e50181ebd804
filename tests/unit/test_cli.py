"""The command line's parser: global options in either place, and argparse's errors as one line, exit 1."""

from __future__ import annotations

import pytest

from deltabus import cli


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
    ],
)
def test_usage_errors_are_one_line_and_exit_1(capsys, argv, words):
    assert cli.main(argv, environ={}) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and cap.err.startswith("deltabus: error: ") and words in cap.err
    assert "--help" in cap.err  # says where to look, in place of argparse's usage block


@pytest.mark.parametrize("argv", [["--help"], ["topics", "--help"], ["publish", "-h"], ["subscriptions", "update", "--help"]])
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
