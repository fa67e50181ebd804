"""Property-based fuzzing of the command line, run in this process (issue 16).

A bad command line exits 1 with one line, ``deltabus: error: ...``, naming the argument
by its flag (or its positional name), never a traceback, and leaves the warehouse
byte-identical. A good one round-trips: what ``create`` made, ``get`` shows; what
``publish`` (arguments or ``--file`` JSON lines) sent, ``pull`` gives back.

One warehouse for the module, settled before the first hash; DELTABUS_ENGINE=delta-rs so
no Spark starts; derandomized small example counts.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from deltabus import cli
from tests.integration.test_fuzz_api import tree_digest

ENV = {"DELTABUS_ENGINE": "delta-rs", "DELTABUS_PROJECT": "cli"}
FUZZ = settings(
    max_examples=20, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# What an error may start with besides a flag the command line gave: positional names,
# argparse's own sentences, and the answers that are not about one argument.
GENERAL = ("TOPIC", "SUBSCRIPTION", "SNAPSHOT", "DATA", "update:", "the following arguments are required", "unrecognized arguments",
           "argument ", "one of the arguments", "no warehouse at", "topic not found", "subscription not found",
           "dead-letter topic not found", "snapshot not found", "topic already exists", "subscription already exists",
           "invalid choice")


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.warehouse = str(root / "warehouse")
        self.counter = itertools.count()
        for argv in (["topics", "create", "base"], ["topics", "create", "dlq"], ["subscriptions", "create", "base-sub", "--topic", "base"],
                     ["topics", "create", "any"], ["subscriptions", "create", "any-sub", "--topic", "any"],
                     ["subscriptions", "create", "upd-sub", "--topic", "dlq"], ["pull", "upd-sub"],
                     ["publish", "base", "settle"], ["pull", "base-sub", "--ack"], ["pull", "any-sub"]):
            code, _, err = self.run(argv)
            assert code == 0, err

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(["--warehouse", self.warehouse, *argv], out=out, environ=ENV)
        return code, out.getvalue(), err.getvalue()

    def fresh(self) -> str:
        return f"fresh-{next(self.counter)}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield World(tmp_path_factory.mktemp("fuzz-cli"))


def attempt(world: World, argv: list[str], also: tuple[str, ...] = ()) -> tuple[int, str, str]:
    """Run argv; an error must be one line naming a flag of argv (or a GENERAL answer, or
    one of `also`) and write nothing."""
    before = tree_digest(world.warehouse)
    code, out, err = world.run(argv)
    event(f"exit {code}")
    if code == 0:
        return code, out, err
    assert code == 1, (argv, code, err)
    assert err.startswith("deltabus: error: ") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    said = err[len("deltabus: error: "):]
    flags = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
    assert said.startswith(tuple(flags) + GENERAL + also), (argv, err)
    assert tree_digest(world.warehouse) == before, (argv, "a failed command wrote to the warehouse")
    return code, out, err


# -- strategies ---------------------------------------------------------------------------------
words = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10)
ids = st.from_regex(r"[a-z][a-z0-9\-_.~+%]{2,12}", fullmatch=True).filter(lambda s: not s.startswith("goog"))
numbers = st.one_of(st.integers(-10, 1000).map(str), st.sampled_from(["nan", "inf", "-inf", "1e400", "", " ", "1_0", "0x10", "7d", "-1"]), words)
durations = st.one_of(st.sampled_from(["10m", "1d", "7d", "31d", "366d", "36h", "600", "0", "-1h", "never", "nan", "1e400d", "1.5s"]), numbers)
pairs = st.one_of(st.builds(lambda k, v: f"{k}={v}", st.from_regex(r"[a-z][a-z0-9_\-]{0,6}", fullmatch=True),
                            st.from_regex(r"[a-z0-9_\-]{0,6}", fullmatch=True)), words)
endpoints = st.sampled_from(["https://example.com/push", "http://127.0.0.1:8/x", "https://example.com:0/", "https://u:p@example.com/",
                             "ftp://x.com/", "https://a b/", "", "https://example.com/#f", "https://ok.example.com/p?token=1"])


def options(spec: dict[str, Any]) -> st.SearchStrategy[list[str]]:
    """A list of flag/value arguments drawn from `spec` (flag -> value strategy, or None for a switch)."""
    def one(flag: str) -> st.SearchStrategy[list[str]]:
        value = spec[flag]
        return st.just([flag]) if value is None else value.map(lambda v: [flag, v])

    return st.lists(st.sampled_from(sorted(spec)).flatmap(one), max_size=4).map(lambda parts: [a for p in parts for a in p])


TOPIC_OPTIONS = {"--label": pairs, "--retention": durations}
SUB_OPTIONS = {
    "--ack-deadline": numbers, "--label": pairs, "--push-endpoint": endpoints, "--oidc-service-account": st.sampled_from(["sa@p.iam", "no", ""]),
    "--oidc-audience": words, "--no-wrapper": None, "--write-metadata": None, "--allow-http": None,
    "--filter": st.one_of(st.sampled_from(['attributes.k = "v"', "attributes:k AND", 'hasPrefix(attributes.a, "x")', "x" * 257]), words),
    "--min-backoff": numbers, "--max-backoff": numbers, "--dead-letter-topic": st.sampled_from(["dlq", "missing", "bad\n", "ab"]),
    "--max-delivery-attempts": numbers, "--ttl": durations, "--retention": durations, "--retain-acked": None, "--exactly-once": None,
    "--enable-message-ordering": None,
}


# -- topics and subscriptions -------------------------------------------------------------------
@FUZZ
@given(st.one_of(st.just("fresh"), ids, st.sampled_from(["ab", "goog-x", "a b", "abc\n", "projects/cli/topics/x\n", "-x"]), words),
       options(TOPIC_OPTIONS))
@example("fresh", ["--label", "team\n=data"])
@example("fresh", ["--retention", "1e400"])
def test_topics_create(world: World, name: str, flags: list[str]) -> None:
    name = world.fresh() if name == "fresh" else name
    code, out, _ = attempt(world, ["topics", "create", name, *flags])
    if code == 0:
        code, shown, err = world.run(["topics", "get", name])
        assert code == 0, err
        got = json.loads(shown)
        labels = dict(p.split("=", 1) for i, p in enumerate(flags) if i and flags[i - 1] == "--label")
        assert got["labels"] == labels


@FUZZ
@given(st.one_of(st.just("fresh"), ids, st.sampled_from(["ab", "goog-x", "abc\n"])), st.sampled_from(["base", "missing", "a\n"]),
       options(SUB_OPTIONS))
@example("fresh", "base", ["--max-backoff", "5"])  # only --max-backoff given: the error must name it
@example("fresh", "base", ["--push-endpoint", "http://127.0.0.1:8/x"])
@example("fresh", "base", ["--push-endpoint", "http://127.0.0.1:8/x", "--allow-http", "--exactly-once"])
@example("fresh", "base", ["--oidc-audience", "x"])
@example("fresh", "base", ["--ttl", "1e400d"])
def test_subscriptions_create(world: World, name: str, topic: str, flags: list[str]) -> None:
    name = world.fresh() if name == "fresh" else name
    code, _, _ = attempt(world, ["subscriptions", "create", name, "--topic", topic, *flags])
    if code == 0:
        code, shown, err = world.run(["subscriptions", "get", name])
        assert code == 0, err
        got = json.loads(shown)
        given_ = {flags[i]: flags[i + 1] if i + 1 < len(flags) else None for i in range(len(flags)) if flags[i].startswith("--")}
        if "--push-endpoint" in given_:
            assert got["push_endpoint"] == flags[len(flags) - 1 - flags[::-1].index("--push-endpoint") + 1]
        if "--filter" in given_:
            assert got["filter"] == flags[len(flags) - 1 - flags[::-1].index("--filter") + 1]
        assert got["topic"] == "projects/cli/topics/base"


UPDATE_OPTIONS = {k: v for k, v in SUB_OPTIONS.items() if k not in ("--filter", "--enable-message-ordering")}
UPDATE_OPTIONS.update({"--pull": None, "--clear-retry-policy": None, "--clear-dead-letter-policy": None, "--no-exactly-once": None})


@FUZZ
@given(st.sampled_from(["upd", "missing", "ab"]), options(UPDATE_OPTIONS))
@example("upd", [])
@example("upd", ["--pull", "--push-endpoint", "https://example.com/p"])
@example("upd", ["--max-backoff", "0"])
@example("upd", ["--ack-deadline", "30", "--label", "a=b", "--min-backoff", "1", "--ttl", "never"])  # only --max-backoff given: the error named --min-backoff
def test_subscriptions_update(world: World, which: str, flags: list[str]) -> None:
    which = {"upd": "upd-sub"}.get(which, which)
    code, _, _ = attempt(world, ["subscriptions", "update", which, *flags])
    if code == 0:
        code, shown, err = world.run(["subscriptions", "get", which])
        assert code == 0, err
        if "--pull" in flags:
            assert json.loads(shown)["push_endpoint"] == ""


# -- publish and pull ---------------------------------------------------------------------------
@FUZZ
@given(st.lists(st.one_of(words, st.just("")), max_size=3), st.lists(pairs, max_size=2),
       st.one_of(st.none(), words, st.just("k" * 1025)), st.sampled_from(["base", "missing"]))
@example([""], [], None, "base")
@example(["x"], ["goog=1"], None, "base")
@example(["x"], ["=v"], None, "base")
@example(["-1", "x"], ["k=v"], None, "base")  # `publish T --attribute k=v -- -1 x`: the `--` was an unrecognized argument
def test_publish_arguments(world: World, data: list[str], attrs: list[str], okey: str | None, topic: str) -> None:
    argv = ["publish", topic, *[a for p in attrs for a in ("--attribute", p)], *(["--ordering-key", okey] if okey is not None else []), "--", *data]
    code, out, _ = attempt(world, argv)
    if code == 0:
        ids = out.split()
        assert len(ids) == len(data)
        pulled = pull_all(world, len(ids))
        expected_attrs = dict(p.split("=", 1) for p in attrs)
        for i, d in zip(ids, data):
            assert pulled[i]["data"] == d and pulled[i]["attributes"] == expected_attrs
            assert pulled[i]["ordering_key"] == (okey or "")


def pull_all(world: World, n: int) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}
    for _ in range(5):
        code, out, err = world.run(["pull", "base-sub", "--max-messages", "1000", "--ack"])
        assert code == 0, err
        for line in out.splitlines():
            m = json.loads(line)
            if "data_base64" in m:
                m["data"] = base64.b64decode(m["data_base64"])
            got[m["message_id"]] = m
        if len(got) >= n:
            break
    return got


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
                           lambda i: st.one_of(st.lists(i, max_size=2), st.dictionaries(st.text(max_size=4), i, max_size=2)), max_leaves=4)
good_lines = st.fixed_dictionaries(
    {}, optional={"data": st.text(min_size=1, max_size=10), "attributes": st.dictionaries(st.from_regex(r"[a-z]{1,5}", fullmatch=True),
                                                                                          st.text(max_size=5), max_size=2),
                  "ordering_key": st.text(max_size=4)},
).filter(lambda o: o.get("data") or o.get("attributes"))
lines = st.one_of(
    good_lines.map(json.dumps), good_lines.map(json.dumps),
    st.dictionaries(st.sampled_from(["data", "data_base64", "attributes", "ordering_key", "colour"]), json_values, max_size=3).map(json.dumps),
    st.sampled_from(["", "   ", "{", "[]", '{"data": NaN}', '{"data_base64": "AAE"}', '{"data": "a", "data": "b"}', "\ufeff{}"]),
)


@FUZZ
@given(st.lists(lines, min_size=1, max_size=4), st.booleans())
@example(['{"data": "ok"}', '{"data": "x", "colour": "red"}'], False)
@example(['{"data": "ok"}', "\udcff"], False)
@example(['{"data": "ok"}'], True)
def test_publish_file(world: World, texts: list[str], bad_utf8: bool) -> None:
    path = world.root / f"lines-{next(world.counter)}.jsonl"
    raw = b"\n".join(t.encode("utf-8", "surrogateescape") for t in texts) + b"\n"
    if bad_utf8:
        raw += b'{"data": "\xff"}\n'
    path.write_bytes(raw)
    code, out, err = attempt(world, ["publish", "base", "--file", str(path), "--quiet"], also=(f"{path}:",))  # by file and line
    if code:
        return
    expected = [json.loads(t) for t in texts if t.strip() and t.strip() != "\ufeff"]
    assert out.startswith(f"published {len(expected)} messages")
    pulled = sorted(pull_all(world, len(expected)).values(), key=lambda m: m["publish_time"])
    assert len(pulled) == len(expected)

    def key(d: Any, a: Any, o: Any) -> str:
        return json.dumps([d if isinstance(d, str) else base64.b64encode(d).decode(), a, o], sort_keys=True)

    sent = sorted(key(e.get("data", ""), e.get("attributes", {}), e.get("ordering_key", "")) for e in expected)
    back = sorted(key(m["data"], m["attributes"], m["ordering_key"]) for m in pulled)
    assert back == sent


@FUZZ
@given(st.sampled_from(["base-sub", "missing", "ab"]), st.one_of(st.none(), numbers), st.one_of(st.none(), numbers))
@example("base-sub", "0", None)
@example("base-sub", None, "nan")
def test_pull_flags(world: World, sub: str, n: str | None, wait: str | None) -> None:
    argv = ["pull", sub, *(["--max-messages", n] if n is not None else []), "--wait", wait if wait is not None else "0"]
    if wait is not None:
        try:
            if 0 < float(wait):
                argv[-1] = "-1"  # a good wait would hold the test: only bad ones here
        except ValueError:
            pass
    attempt(world, argv)


@FUZZ
@given(st.sampled_from(["base-sub", "missing"]), st.one_of(
    st.builds(lambda t: ["--time", t], st.one_of(durations.map(lambda d: "-" + d), st.text("0123456789-T:Z.", max_size=22), words)),
    st.builds(lambda s: ["--snapshot", s], st.sampled_from(["missing", "ab", "projects/x/snapshots/abc"])),
    st.just([])))
@example("base-sub", ["--time", "-99999999999999999999d"])  # before year 1: OverflowError before the fix
@example("base-sub", ["--time", "99999-01-01T00:00:00Z"])
def test_seek_flags(world: World, sub: str, target: list[str]) -> None:
    attempt(world, ["seek", sub, *target])


VOCABULARY = ["topics", "subscriptions", "snapshots", "publish", "pull", "seek", "create", "get", "list", "update", "delete", "detach",
              "any", "any-sub", "missing", "--topic", "--label", "--ack-deadline", "--push-endpoint", "--max-messages", "--time",
              "--snapshot", "--file", "--attribute", "--project", "--retention", "--ttl", "--pull", "-", "--", "x=y", "10", "-1h",
              "https://example.com/p", "", "goog", "--help-me", "--subscription"]


@settings(FUZZ, max_examples=25)
@given(st.lists(st.one_of(st.sampled_from(VOCABULARY), words), min_size=1, max_size=6))
@example(["topics", "delete"])
@example(["publish", "any", "--file", "/nonexistent/file.jsonl"])
@example(["subscriptions", "update", "any-sub"])
def test_any_command_line(world: World, argv: list[str]) -> None:
    """Anything goes, on names of its own ("any", "any-sub"): the other tests' names stay as they are."""
    argv = [{"base": "any", "base-sub": "any-sub"}.get(a, a) for a in argv]
    if "--file" in argv and argv[-1:] != ["--file"]:  # never read stdin (`--file -`)
        argv = [a if a != "-" else "/nonexistent" for a in argv]
    attempt(world, argv)
