"""The deltabus command line: topics, subscriptions, snapshots, seek, publish, pull, backlog.

--warehouse and --project go before or after the command. Names are full
(projects/P/topics/T) or short ids under --project (default: $DELTABUS_PROJECT or
local). The warehouse is --warehouse, else $DELTABUS_WAREHOUSE, else ./warehouse. Only
'init', 'topics create' and the push job create a warehouse; every other command on a
path with none says "no warehouse at PATH" and creates nothing.

An error prints one line, 'deltabus: error: ...', naming the bad argument, and exits 1;
nothing is written. Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Iterator, Mapping, NoReturn, Protocol, Sequence, TextIO

from .errors import DeltabusError, InvalidArgument, WarehouseNotFound
from .jsonl import LineError
from .validation import endpoint_scheme

BATCH = 1000  # messages per commit of publish --file
INTERRUPTED = 130  # the shell's code for a process ended by Ctrl-C (128 + SIGINT)

JSONL_HELP = """\
FILE holds one JSON object per line (- reads stdin); blank lines are skipped:
  {"data": "text"}                     data as UTF-8 text
  {"data": {"order": 1}}               an object or array is sent as compact JSON: {"order":1}
  {"data_base64": "AAEC"}              binary data (standard, padded base64), instead of data
  "attributes": {"k": "v"}             string values only; added to --attribute (the line wins)
  "ordering_key": "k"                  a string; default --ordering-key
data null, a number or a boolean, any other field, or a bad value is an error naming
FILE:LINE and the field. Every line is checked before anything is published; then one
commit per 1,000 messages. Ctrl-C stops between commits and says what was published.
"""


class UsageError(Exception):
    """A command line argparse could not parse (raised instead of argparse's exit 2)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


class _Interrupted(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


# -- names and small parsers -----------------------------------------------------------------
def _topic(args: argparse.Namespace, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{args.project}/topics/{name}"


def _sub(args: argparse.Namespace, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{args.project}/subscriptions/{name}"


def _snapshot(args: argparse.Namespace, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{args.project}/snapshots/{name}"


def _pairs(pairs: Sequence[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise InvalidArgument(flag, f"expected KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text!r}")
    return value


TIME_RULE = "must be an RFC 3339 time such as 2026-11-26T12:00:00Z, or a duration back from now such as -1h, -30m or -2d"
# What `seek` reads as a value although it starts with '-' (a '-' then a digit, as Python
# 3.13's argparse does): older argparse reads only plain negative numbers so, and would take
# "-1h" for an unknown option. No option of `seek` starts with a digit.
RELATIVE_TIME = re.compile(r"^-\.?\d")


def _seek_time(text: str, now: float) -> float:
    """`seek --time`: an RFC 3339 time, or a duration back from `now` (``-1h``), as seconds
    since the epoch. Checked before anything is opened; errors name --time."""
    from .subscription_fields import parse_duration
    from .types import timestamp_seconds

    stripped = text.strip()
    value: str | float = stripped
    if stripped.startswith("-"):
        try:
            back = parse_duration(stripped[1:])
        except argparse.ArgumentTypeError:
            back = math.nan
        if not math.isfinite(back) or back < 0:
            raise InvalidArgument("--time", f"{TIME_RULE}, got {text!r}")
        value = now - back  # still a time a timestamp holds (not before year 1): checked below
    try:
        return timestamp_seconds(value, "--time")
    except InvalidArgument:
        raise InvalidArgument("--time", f"{TIME_RULE}, got {text!r}") from None


def _rfc3339(when: float | datetime.datetime | None) -> str | None:
    """A time (seconds since the epoch or a datetime; naive is UTC) as RFC 3339 UTC text; None stays None."""
    utc = datetime.timezone.utc
    if when is None:
        return None
    if isinstance(when, datetime.datetime):
        at = (when if when.tzinfo is not None else when.replace(tzinfo=utc)).astimezone(utc)
    else:
        at = datetime.datetime.fromtimestamp(when, utc)
    return at.isoformat(timespec="microseconds" if at.microsecond else "seconds").replace("+00:00", "Z")


def _duration(seconds: float | None) -> str:
    """A duration as the CLI takes it: 2d, 36h, 10m, 45s ('' for none)."""
    if seconds is None:
        return ""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _flag(field: str, flags: Mapping[str, str]) -> str:
    """The command-line name of an API field: 'labels['K']' -> "--label 'K'"."""
    for api, flag in sorted(flags.items(), key=lambda kv: -len(kv[0])):
        if field == api:
            return flag
        if field.startswith(api + "["):
            return f"{flag} {field[len(api) + 1 : -1]}" if field.endswith("]") else flag
        if field.startswith(api + "."):
            return flag
    return field


# -- push configuration ------------------------------------------------------------------------
def _allow_http(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "allow_http", False)) or bool(getattr(args, "env_allow_http", False))


def _push_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The push configuration the flags describe (None: no push flags given)."""
    from .types import PushConfig

    extras = [f for f, on in (("--oidc-service-account", args.oidc_service_account), ("--oidc-audience", args.oidc_audience),
                              ("--no-wrapper", args.no_wrapper), ("--write-metadata", args.write_metadata)) if on]
    if not args.push_endpoint:
        if extras:
            raise InvalidArgument(extras[0], "needs --push-endpoint")
        return None if args.push_endpoint is None else {}
    if args.write_metadata and not args.no_wrapper:
        raise InvalidArgument("--write-metadata", "needs --no-wrapper (Pub/Sub's write_metadata is part of no_wrapper)")
    if args.oidc_audience is not None and not args.oidc_service_account:
        raise InvalidArgument("--oidc-audience", "needs --oidc-service-account")
    cfg: dict[str, Any] = {"push_endpoint": args.push_endpoint}
    if args.oidc_service_account:
        cfg["oidc_token"] = {"service_account_email": args.oidc_service_account, "audience": args.oidc_audience or ""}
    if args.no_wrapper:
        cfg["no_wrapper"] = {"write_metadata": bool(args.write_metadata)}
    PushConfig.coerce(cfg)  # the URL's own rules first, then the scheme
    if endpoint_scheme(args.push_endpoint) == "http" and not _allow_http(args):
        raise InvalidArgument("--push-endpoint", "must be https; add --allow-http to allow plain http (meant for localhost and tests)")
    return cfg


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()

    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _subscription_dict(s: Any) -> dict[str, Any]:
    """What `subscriptions get/list` show: name, topic, every field with a flag (the expiration
    policy as its ttl in seconds, null: never), the retry and
    dead-letter policies (null: none), the push config, and whether it is detached."""
    from . import subscription_fields

    pc = s.push_config
    shown: dict[str, Any] = {"name": s.name, "topic": s.topic}
    for fld in subscription_fields.WITH_FLAG:
        value = getattr(s, fld.name)
        if fld.name == "expiration_policy":  # the ttl in seconds; null: never expires
            value = {"ttl": value.ttl}
        shown[fld.name] = dict(value) if isinstance(value, Mapping) else value
    retry, dead = s.retry_policy, s.dead_letter_policy
    return {
        **shown,
        "retry_policy": None if retry is None else {"minimum_backoff": retry.minimum_backoff, "maximum_backoff": retry.maximum_backoff},
        "dead_letter_policy": None if dead is None else {
            "dead_letter_topic": dead.dead_letter_topic, "max_delivery_attempts": dead.max_delivery_attempts},
        "push_endpoint": pc.push_endpoint,
        "oidc_service_account": pc.oidc_token.service_account_email if pc.oidc_token else "",
        "oidc_audience": pc.oidc_token.audience if pc.oidc_token else "",
        "no_wrapper": pc.no_wrapper is not None,
        "write_metadata": bool(pc.no_wrapper and pc.no_wrapper.write_metadata),
        "detached": s.detached,
        "delta_config": None if s.delta_config is None else {
            "table": s.delta_config.table, "write_metadata": s.delta_config.write_metadata,
            "drop_unknown_fields": s.delta_config.drop_unknown_fields},
    }


def _policy_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The retry and dead-letter policies the flags describe, by field name: a dict, or None
    to clear it (``--clear-*``, update only); a policy whose flags are not given is absent.
    Checked here, before anything is opened, so an error names the flag."""
    from .types import DeadLetterPolicy, RetryPolicy

    out: dict[str, Any] = {}
    backoffs = {k: v for k, v in (("minimum_backoff", args.min_backoff), ("maximum_backoff", args.max_backoff)) if v is not None}
    if getattr(args, "clear_retry_policy", False):
        if backoffs:
            raise InvalidArgument("--clear-retry-policy", "cannot be given with --min-backoff or --max-backoff")
        out["retry_policy"] = None
    elif backoffs:
        out["retry_policy"] = backoffs
        RetryPolicy.coerce(backoffs)
    if getattr(args, "clear_dead_letter_policy", False):
        if args.dead_letter_topic is not None or args.max_delivery_attempts is not None:
            raise InvalidArgument("--clear-dead-letter-policy", "cannot be given with --dead-letter-topic or --max-delivery-attempts")
        out["dead_letter_policy"] = None
    elif args.dead_letter_topic is not None:
        dead: dict[str, Any] = {"dead_letter_topic": _topic(args, args.dead_letter_topic)}
        if args.max_delivery_attempts is not None:
            dead["max_delivery_attempts"] = args.max_delivery_attempts
        DeadLetterPolicy.coerce(dead)
        out["dead_letter_policy"] = dead
    elif args.max_delivery_attempts is not None:
        raise InvalidArgument("--max-delivery-attempts", "needs --dead-letter-topic (a dead-letter policy is both)")
    return out


def _delta_config(args: argparse.Namespace, current: Any = None) -> dict[str, Any]:
    """The Delta export the --delta-* flags describe, by field name: {"delta_config": dict},
    {"delta_config": None} to remove it (``--clear-delta-export``, update only), or {}."""
    from .types import DeltaConfig

    extras = [f for f, on in (("--delta-write-metadata", args.delta_write_metadata),
                              ("--delta-drop-unknown-fields", args.delta_drop_unknown_fields)) if on]
    if getattr(args, "clear_delta_export", False):
        if args.delta_table is not None or extras:
            raise InvalidArgument("--clear-delta-export", "cannot be given with --delta-table or the other --delta-* flags")
        return {"delta_config": None}
    if args.delta_table is None:
        if extras:
            raise InvalidArgument(extras[0], "needs --delta-table")
        return {}
    def keep(given: bool | None, name: str) -> bool:  # update: a flag left out keeps `current`'s value
        return bool(given) if given is not None or current is None else bool(getattr(current, name))

    cfg = {"table": args.delta_table, "write_metadata": keep(args.delta_write_metadata, "write_metadata"),
           "drop_unknown_fields": keep(args.delta_drop_unknown_fields, "drop_unknown_fields")}
    DeltaConfig.coerce(cfg)
    return {"delta_config": cfg}


def _field_flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The subscription fields given by their flags (``subscription_fields.WITH_FLAG``), by field name."""
    from . import subscription_fields

    out: dict[str, Any] = {}
    for fld in subscription_fields.WITH_FLAG:
        assert fld.cli is not None
        raw = getattr(args, fld.cli.dest, None)  # update has no flag for a field it cannot change
        if raw is not None:
            out[fld.name] = _pairs(raw, fld.cli.flag) if fld.cli.collect == "pairs" else raw
    return out


def _publisher(args: argparse.Namespace) -> Any:
    from . import PublisherClient

    return PublisherClient(warehouse=args.warehouse, create_warehouse=False, settings=args.client_settings)  # only create_topic creates one


def _subscriber(args: argparse.Namespace, allow_http: bool = False) -> Any:
    from . import SubscriberClient

    return SubscriberClient(warehouse=args.warehouse, allow_http=allow_http, settings=args.client_settings)


# -- commands --------------------------------------------------------------------------------
def cmd_init(args: argparse.Namespace, out: TextIO) -> None:
    from .storage import check_warehouse_path, open_engine, warehouse_exists

    existed = warehouse_exists(check_warehouse_path(args.warehouse))
    engine = open_engine(args.warehouse, engine="delta-rs", create=True)
    print(f"{'warehouse already at' if existed else 'created warehouse at'} {engine.warehouse}", file=out)


def _topic_dict(t: Any) -> dict[str, Any]:
    """What `topics get` shows: name, labels and the retention in seconds (null: none)."""
    return {"name": t.name, "labels": dict(t.labels), "message_retention_duration": t.message_retention_duration}


def cmd_topics(args: argparse.Namespace, out: TextIO) -> None:
    if args.action == "create":
        request: dict[str, Any] = {"name": _topic(args, args.name), "labels": _pairs(args.label, "--label")}
        if args.retention is not None:
            request["message_retention_duration"] = args.retention
        t = _publisher(args).create_topic(request=request)
        kept = f" (keeps messages {_duration(t.message_retention_duration)})" if t.message_retention_duration else ""
        print(f"created topic {t.name}{kept}", file=out)
    elif args.action == "list":
        rows = [{"name": t.name, "labels": ",".join(f"{k}={v}" for k, v in t.labels.items()),
                 "retention": _duration(t.message_retention_duration)} for t in _publisher(args).list_topics(project=args.project)]
        print(_table(rows, ["name", "labels", "retention"]), file=out)
    elif args.action == "get":
        print(json.dumps(_topic_dict(_publisher(args).get_topic(topic=_topic(args, args.name))), indent=2), file=out)
    elif args.action == "update":
        name = _topic(args, args.name)
        body: dict[str, Any] = {"name": name}
        if args.label is not None:
            body["labels"] = _pairs(args.label, "--label")
        if args.retention is not None or args.no_retention:
            body["message_retention_duration"] = None if args.no_retention else args.retention
        mask = [f for f in body if f != "name"]
        if not mask:
            raise InvalidArgument("update", "nothing to change: give --label, --retention or --no-retention")
        _publisher(args).update_topic(topic=body, update_mask=mask)
        print(f"updated {name}: {', '.join(mask)}", file=out)
    elif args.action == "delete":
        _publisher(args).delete_topic(topic=_topic(args, args.name))
        print(f"deleted topic {_topic(args, args.name)}", file=out)


def cmd_subscriptions(args: argparse.Namespace, out: TextIO) -> None:
    if args.action == "create":
        push = _push_config(args)  # checked before the warehouse is opened
        given = {**_field_flag_values(args), **_policy_flags(args), **_delta_config(args)}
        sub = _subscriber(args, _allow_http(args))
        request: dict[str, Any] = {"name": _sub(args, args.name), "topic": _topic(args, args.topic), **given}
        if push is not None:
            request["push_config"] = push
        # As a request: a field may be settable without being one of create_subscription's keywords.
        s = sub.create_subscription(request=request)
        kind = "push" if s.push_config.is_push else "Delta export" if s.delta_config is not None else "pull"
        print(f"created {kind} subscription {s.name}", file=out)
    elif args.action == "list":
        rows = [_subscription_dict(s) for s in _subscriber(args).list_subscriptions(project=args.project)]
        print(_table(rows, ["name", "topic", "ack_deadline_seconds", "push_endpoint"]), file=out)
    elif args.action == "get":
        print(json.dumps(_subscription_dict(_subscriber(args).get_subscription(subscription=_sub(args, args.name))), indent=2), file=out)
    elif args.action == "update":
        name = _sub(args, args.name)
        current = None
        if args.delta_table is not None and (args.delta_write_metadata is None or args.delta_drop_unknown_fields is None):
            _delta_config(args)  # a bad flag is refused before the warehouse is opened
            current = _subscriber(args).get_subscription(subscription=name).delta_config
        given = {**_field_flag_values(args), **_policy_flags(args), **_delta_config(args, current)}
        body: dict[str, Any] = {"name": name, **given}
        mask = list(given)
        if args.pull:
            args.push_endpoint = ""  # the push options then need --push-endpoint: an error, not ignored
        push = _push_config(args)
        if push is not None:
            body["push_config"] = push
            mask.append("push_config")
        if not mask:
            from .subscription_fields import WITH_FLAG

            flags = [f.cli.flag for f in WITH_FLAG if f.cli is not None and f.updatable]
            flags += ["--min-backoff", "--max-backoff", "--clear-retry-policy", "--dead-letter-topic", "--clear-dead-letter-policy",
                      "--delta-table", "--clear-delta-export"]
            raise InvalidArgument("update", f"nothing to change: give {', '.join(flags)}, --push-endpoint or --pull")
        s = _subscriber(args, _allow_http(args)).update_subscription(subscription=body, update_mask=mask)
        print(f"updated {s.name}: {', '.join(mask)}", file=out)
    elif args.action == "delete":
        _subscriber(args).delete_subscription(subscription=_sub(args, args.name))
        print(f"deleted subscription {_sub(args, args.name)}", file=out)
    elif args.action == "detach":
        _publisher(args).detach_subscription(subscription=_sub(args, args.name))
        print(f"detached subscription {_sub(args, args.name)} from its topic (its messages are dropped)", file=out)


def _snapshot_dict(n: Any) -> dict[str, Any]:
    """What `snapshots get` shows: name, topic, labels and when maintenance deletes it."""
    return {"name": n.name, "topic": n.topic, "labels": dict(n.labels), "expire_time": _rfc3339(n.expire_time)}


def cmd_snapshots(args: argparse.Namespace, out: TextIO) -> None:
    if args.action == "create":
        request = {"name": _snapshot(args, args.name), "subscription": _sub(args, args.subscription),
                   "labels": _pairs(args.label, "--label")}
        n = _subscriber(args).create_snapshot(request=request)
        print(f"created snapshot {n.name} of {request['subscription']} (expires {_rfc3339(n.expire_time)})", file=out)
    elif args.action == "list":
        rows = [{**_snapshot_dict(n), "labels": ",".join(f"{k}={v}" for k, v in n.labels.items())}
                for n in _subscriber(args).list_snapshots(project=args.project)]
        print(_table(rows, ["name", "topic", "expire_time", "labels"]), file=out)
    elif args.action == "get":
        print(json.dumps(_snapshot_dict(_subscriber(args).get_snapshot(snapshot=_snapshot(args, args.name))), indent=2), file=out)
    elif args.action == "update":
        name = _snapshot(args, args.name)
        labels = _pairs(args.label, "--label")
        _subscriber(args).update_snapshot(snapshot={"name": name, "labels": labels}, update_mask=["labels"])
        print(f"updated {name}: labels", file=out)
    elif args.action == "delete":
        _subscriber(args).delete_snapshot(snapshot=_snapshot(args, args.name))
        print(f"deleted snapshot {_snapshot(args, args.name)}", file=out)


def cmd_seek(args: argparse.Namespace, out: TextIO) -> None:
    name = _sub(args, args.subscription)
    if args.time is not None:
        at = _seek_time(args.time, time.time())  # checked before the warehouse is opened
        _subscriber(args).seek(request={"subscription": name, "time": at})
        print(f"seeked {name} to {_rfc3339(at)} (messages published before it count as acked)", file=out)
    else:
        snapshot = _snapshot(args, args.snapshot)
        _subscriber(args).seek(request={"subscription": name, "snapshot": snapshot})
        print(f"seeked {name} to snapshot {snapshot} (its unacked messages and every later one are unacked)", file=out)


def _argument_messages(args: argparse.Namespace, attrs: dict[str, str]) -> list[tuple[int, bytes]]:
    """DATA arguments as (position, bytes), each checked; errors name DATA n, --attribute or --ordering-key."""
    from .validation import check_message

    out = []
    for i, text in enumerate(args.data, 1):
        data = os.fsencode(text)  # the argument's own bytes, even when they are not UTF-8
        try:
            check_message(data, attrs, args.ordering_key, where="message")
        except InvalidArgument as exc:
            field = _flag(exc.field, {"message.attributes": "--attribute", "message.ordering_key": "--ordering-key",
                                      "message.data": f"DATA {i}", "message": f"DATA {i}"})
            raise InvalidArgument(field, exc.rule) from None
        out.append((i, data))
    return out


def cmd_publish(args: argparse.Namespace, out: TextIO) -> None:
    attrs = _pairs(args.attribute, "--attribute")
    topic = _topic(args, args.topic)
    if args.file is not None and args.data:
        raise InvalidArgument("--file", "give message data as arguments or with --file, not both")
    if args.file is None:
        if not args.data:
            raise InvalidArgument("DATA", "give message data as arguments, or --file FILE.jsonl")
        checked = _argument_messages(args, attrs)
        ids = _publisher(args).publish_batch(topic, [{"data": d, "attributes": attrs, "ordering_key": args.ordering_key} for _, d in checked])
        for i in ids:
            print(i, file=out)
        return

    from tqdm import tqdm

    from .jsonl import read_lines

    source = "stdin" if args.file == "-" else args.file
    try:
        f = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        raise InvalidArgument("--file", f"cannot read {args.file}: {exc.strerror}") from None
    with f:
        # Every line is checked before the first commit, so a bad line publishes nothing.
        lines = read_lines(f, source, attributes=attrs, ordering_key=args.ordering_key)
    pub = _publisher(args)
    pub.get_topic(topic=topic)  # a missing warehouse or topic fails before the progress bar
    done = 0
    with _deferred_interrupt() as stop, tqdm(
        total=len(lines), unit="msg", file=sys.stderr, disable=len(lines) < 10 * BATCH or args.quiet
    ) as bar:
        for start in range(0, len(lines), BATCH):
            if stop.is_set():
                break
            chunk = lines[start : start + BATCH]
            try:
                pub.publish_batch(topic, [{"data": m.data, "attributes": m.attributes, "ordering_key": m.ordering_key} for m in chunk])
            except DeltabusError as exc:
                if not done:
                    raise
                raise DeltabusError(f"{_published(done, lines, source)}; then: {exc}") from None
            done += len(chunk)
            bar.update(len(chunk))
    if done < len(lines):
        raise _Interrupted(_published(done, lines, source))
    print(f"published {done} messages to {topic}", file=out)


def _published(done: int, lines: Sequence[Any], source: str) -> str:
    through = f" (lines 1-{lines[done - 1].number} of {source})" if done else ""
    return f"published {done} of {len(lines)} messages{through}; the rest were not published"


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[threading.Event]:
    """Ctrl-C sets the event instead of interrupting, so publish stops between commits and
    knows exactly what it committed (a KeyboardInterrupt raised just after a commit returned
    would have been counted as not published). A second Ctrl-C interrupts at once."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_pull(args: argparse.Namespace, out: TextIO) -> None:
    sub = _subscriber(args)
    name = _sub(args, args.subscription)
    got = sub.pull(subscription=name, max_messages=args.max_messages, return_immediately=args.wait == 0, timeout=args.wait).received_messages
    for r in got:
        m = r.message
        try:
            data: dict[str, str] = {"data": m.data.decode("utf-8")}
        except UnicodeDecodeError:
            data = {"data_base64": base64.b64encode(m.data).decode()}
        print(json.dumps({"message_id": m.message_id, **data, "attributes": dict(m.attributes), "ordering_key": m.ordering_key,
                          "publish_time": m.publish_time.isoformat() if m.publish_time else None,
                          "delivery_attempt": r.delivery_attempt, "ack_id": r.ack_id}), file=out)
    if args.ack and got:
        sub.acknowledge(subscription=name, ack_ids=[r.ack_id for r in got])
    print(f"{len(got)} messages{' (acked)' if args.ack and got else ''}", file=sys.stderr)


def cmd_serve(args: argparse.Namespace, out: TextIO) -> None:
    """Serve google.pubsub.v1 until SIGTERM or Ctrl-C (then exit 0): one ready line on stdout."""
    import asyncio

    from .server import app
    from .server.settings import ServeSettings

    settings = ServeSettings(
        warehouse=args.warehouse, port=args.port, host=args.host, tls_cert=args.tls_cert, tls_key=args.tls_key,
        insecure=args.insecure, allow_http=_allow_http(args), history=not args.no_history, defer_seconds=args.defer_seconds,
    )

    def announce(line: str) -> None:
        print(line, file=out, flush=True)

    asyncio.run(app.serve(settings, announce))


def cmd_backlog(args: argparse.Namespace, out: TextIO) -> None:
    sub = _subscriber(args)
    figures = {b.subscription: b for b in sub.refresh_backlog()}  # also what `select ... from backlog` shows
    rows = []
    for s in sub.list_subscriptions(project=args.project):
        b = figures[s.name]
        rows.append({
            "subscription": s.name, "type": "push" if s.push_config.is_push else "pull",
            "undelivered": b.num_undelivered_messages, "outstanding": b.num_outstanding_messages,
            "expired": b.expired_ack_deadlines, "oldest_unacked_s": f"{b.oldest_unacked_message_age:.1f}",
            "backoff_s": "" if b.backoff_seconds is None else f"{b.backoff_seconds:.1f}",
            "backoff_reason": b.backoff_reason or "", "last_status": b.last_status or "",
        })
    print(_table(rows, ["subscription", "type", "undelivered", "outstanding", "expired", "oldest_unacked_s",
                        "backoff_s", "backoff_reason", "last_status"]), file=out)


def _days(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    days = seconds / 86400
    return f"{days:g} day" if days == 1 else f"{days:g} days"


def cmd_maintenance(args: argparse.Namespace, out: TextIO) -> None:
    import time

    from . import retention
    from .registry import Registry
    from .storage import open_engine

    if args.retention_hours < 0:
        raise InvalidArgument("--retention-hours", f"must be >= 0, got {args.retention_hours}")
    if args.history_retention_days < 0:  # checked before anything is deleted
        raise InvalidArgument("--history-retention-days", f"must be >= 0, got {args.history_retention_days}")
    engine = open_engine(args.warehouse, engine="delta-rs", create=False)  # maintenance is delta-rs's
    # Expiration policies first: an expired subscription's cursor then no longer holds history.
    for rec in Registry(engine, clock=time.time).delete_expired(time.time()):
        print(f"deleted expired subscription {rec.name} (unused for over {_days(rec.expiration_policy.ttl)})", file=out)
    done = retention.apply_retention(engine, clock=time.time, history_retention_days=args.history_retention_days)
    print(
        f"retention: {done['unacked_dropped']} unacked messages past their subscription's retention dropped, "
        f"{done['topics_trimmed']} topics trimmed, {done['snapshots_expired']} expired snapshots deleted"
        + (f", rows of {done['deliveries_orphans']} deleted subscriptions swept" if done["deliveries_orphans"] else "")
        + (f", {done['snapshot_orphans']} leftover snapshot partitions swept" if done["snapshot_orphans"] else "")
        + (f", {done['history_days_dropped']} days of delivery history dropped" if done["history_days_dropped"] else ""),
        file=out,
    )
    rows = retention.maintain(engine, retention_hours=args.retention_hours, clock=time.time, retain=False)
    print(_table(rows, ["table", "files_before", "files_after", "vacuumed", "compactions_skipped", "version"]), file=out)


# -- parser ------------------------------------------------------------------------------------
def _global_options(top: bool) -> argparse.ArgumentParser:
    # Given before the command they land on the top parser; after it, on the command's. The
    # commands' copies default to SUPPRESS so that they never overwrite what came before.
    default = None if top else argparse.SUPPRESS
    g = _Parser(add_help=False)
    g.add_argument("--warehouse", default=default, metavar="PATH", help="warehouse path or URI (default: $DELTABUS_WAREHOUSE or ./warehouse)")
    g.add_argument("--project", default=default, help="project of short names (default: $DELTABUS_PROJECT or local)")
    return g


PUSH_FLAGS = {
    "push_config.push_endpoint": "--push-endpoint",
    "push_config.oidc_token.service_account_email": "--oidc-service-account",
    "push_config.oidc_token.audience": "--oidc-audience",
    "push_config.no_wrapper": "--no-wrapper",
    "push_config": "--push-endpoint",
}
# The Delta export's flags (issue 17); DeltaConfig names its own sub-fields.
DELTA_FLAGS = {
    "delta_config.table": "--delta-table",
    "delta_config.write_metadata": "--delta-write-metadata",
    "delta_config.drop_unknown_fields": "--delta-drop-unknown-fields",
    "delta_config": "--delta-table",
}
# The delivery policies' flags (issue 13); RetryPolicy and DeadLetterPolicy name their own
# sub-fields, as PushConfig does.
POLICY_FLAGS = {
    "retry_policy.minimum_backoff": "--min-backoff",
    "retry_policy.maximum_backoff": "--max-backoff",
    "retry_policy": "--min-backoff",
    "dead_letter_policy.dead_letter_topic": "--dead-letter-topic",
    "dead_letter_policy.max_delivery_attempts": "--max-delivery-attempts",
    "dead_letter_policy": "--dead-letter-topic",
}


class _Subcommands(Protocol):
    """What `build_parser` uses of ``add_subparsers()``'s result (argparse's class for it is private)."""

    def add_parser(self, name: str, **kw: Any) -> argparse.ArgumentParser: ...


def build_parser() -> argparse.ArgumentParser:
    common = _global_options(top=False)
    raw = argparse.RawDescriptionHelpFormatter

    p = _Parser(prog="deltabus", description=__doc__, formatter_class=raw, parents=[_global_options(top=True)])
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(parent: _Subcommands, name: str, help: str, flags: Mapping[str, str] | None = None, **kw: Any) -> argparse.ArgumentParser:
        q = parent.add_parser(name, help=help, description=help, parents=[common], formatter_class=raw, **kw)
        q.set_defaults(flags=dict(flags or {}))
        return q

    i = command(cmds, "init", "create an empty warehouse (its tables) if there is none; the push job and 'topics create' also do")
    i.set_defaults(func=cmd_init)

    from .subscription_fields import parse_duration

    t = command(cmds, "topics", "create, list, get, update or delete topics")
    ta = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = command(ta, "create", "create a topic (and the warehouse, if there is none)",
                {"name": "TOPIC", "labels": "--label", "message_retention_duration": "--retention"})
    c.add_argument("name", metavar="TOPIC")
    c.add_argument("--label", action="append", metavar="KEY=VALUE")
    c.add_argument("--retention", type=parse_duration, metavar="DURATION",
                   help="keep every message this long, acked or not, so subscriptions can seek back: 10m..31d (default: none)")
    command(ta, "list", "list the project's topics")
    g = command(ta, "get", "show one topic as JSON", {"topic": "TOPIC"})
    g.add_argument("name", metavar="TOPIC")
    u = command(ta, "update", "change a topic's labels or retention",
                {"topic.name": "TOPIC", "topic.labels": "--label", "topic.message_retention_duration": "--retention"})
    u.add_argument("name", metavar="TOPIC")
    u.add_argument("--label", action="append", metavar="KEY=VALUE", help="the new labels (replace all of them)")
    keep = u.add_mutually_exclusive_group()
    keep.add_argument("--retention", type=parse_duration, metavar="DURATION", help="10m..31d")
    keep.add_argument("--no-retention", action="store_true", help="remove the topic's retention")
    d = command(ta, "delete", "delete a topic (its subscriptions keep what they hold)", {"topic": "TOPIC"})
    d.add_argument("name", metavar="TOPIC")
    t.set_defaults(func=cmd_topics)

    def push_options(q: argparse.ArgumentParser, endpoint: Any = None) -> None:
        (endpoint or q).add_argument("--push-endpoint", metavar="URL", help="push to this https URL (empty: pull)")
        q.add_argument("--oidc-service-account", metavar="EMAIL", help="sign pushes with a JWT for this service account")
        q.add_argument("--oidc-audience", metavar="AUD", help="with --oidc-service-account: the JWT audience (default: the endpoint URL)")
        q.add_argument("--no-wrapper", action="store_true", help="push the raw data as the body")
        q.add_argument("--write-metadata", action="store_true", help="with --no-wrapper: message metadata in headers")
        q.add_argument("--allow-http", action="store_true", help="allow a plain http:// endpoint (localhost, tests)")

    from .subscription_fields import WITH_FLAG

    def field_options(q: argparse.ArgumentParser, update: bool) -> None:
        """A flag per subscription field that declares one (on update: the updatable ones)."""
        for fld in WITH_FLAG:
            flag = fld.cli
            assert flag is not None
            if update and not fld.updatable:
                continue
            text = flag.update_help if update else flag.create_help
            if flag.collect == "pairs":
                q.add_argument(flag.flag, action="append", metavar=flag.metavar, help=text)
            elif flag.collect == "switch" and update:  # --x / --no-x: an update may turn it off
                q.add_argument(flag.flag, action=argparse.BooleanOptionalAction, default=None, help=text)
            elif flag.collect == "switch":
                q.add_argument(flag.flag, action="store_const", const=True, help=text)
            elif flag.parse is not None:
                q.add_argument(flag.flag, type=flag.parse, metavar=flag.metavar, help=text)
            else:
                q.add_argument(flag.flag, metavar=flag.metavar, help=text)

    s = command(cmds, "subscriptions", "create, list, get, update, detach or delete subscriptions")
    sa = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    def policy_options(q: argparse.ArgumentParser, update: bool) -> None:
        """The retry and dead-letter policies' flags (each policy is built from two)."""
        retry = q.add_argument_group("retry policy", "giving either backoff sets a policy; the other takes its default")
        retry.add_argument("--min-backoff", type=_seconds, metavar="SECONDS", help="0..600 (default 10)")
        retry.add_argument("--max-backoff", type=_seconds, metavar="SECONDS", help="0..600 (default 600)")
        dead = q.add_argument_group("dead-letter policy")
        dead.add_argument("--dead-letter-topic", metavar="TOPIC", help="publish messages delivered too often here (must exist)")
        dead.add_argument("--max-delivery-attempts", type=int, metavar="N", help="with --dead-letter-topic: 5..100 (default 5)")
        if update:
            retry.add_argument("--clear-retry-policy", action="store_true", help="remove the retry policy (redeliver at once)")
            dead.add_argument("--clear-dead-letter-policy", action="store_true", help="remove the dead-letter policy")

    def delta_options(q: argparse.ArgumentParser, update: bool) -> None:
        """The Delta export's flags (issue 17; Pub/Sub's BigQuery subscription)."""
        delta = q.add_argument_group("Delta export", "the push job appends the messages to a Delta table, then acks them")
        delta.add_argument("--delta-table", metavar="PATH_OR_URI", help="absolute path or URI of the Delta table (created if missing)")
        # On update, left out: the current value stays (--no-delta-… turns one off), as other update flags do.
        flag: dict[str, Any] = {"action": argparse.BooleanOptionalAction, "default": None} if update else {"action": "store_true"}
        delta.add_argument("--delta-write-metadata", **flag,
                           help="with --delta-table: add subscription_name, message_id, publish_time, attributes")
        delta.add_argument("--delta-drop-unknown-fields", **flag,
                           help="with --delta-table: drop columns an existing table lacks instead of failing")
        if update:
            delta.add_argument("--clear-delta-export", action="store_true", help="stop exporting (a pull subscription again)")

    c = command(sa, "create", "create a subscription",
                {"name": "SUBSCRIPTION", "topic": "--topic", **{f.name: f.cli.flag for f in WITH_FLAG if f.cli}, **PUSH_FLAGS,
                 **POLICY_FLAGS, **DELTA_FLAGS})
    c.add_argument("name", metavar="SUBSCRIPTION")
    c.add_argument("--topic", required=True)
    field_options(c, update=False)
    policy_options(c, update=False)
    delta_options(c, update=False)
    push_options(c)
    command(sa, "list", "list the project's subscriptions")
    g = command(sa, "get", "show one subscription as JSON", {"subscription": "SUBSCRIPTION"})
    g.add_argument("name", metavar="SUBSCRIPTION")
    u = command(sa, "update", "change the ack deadline, labels, push configuration, retry or dead-letter policy",
                {"subscription.name": "SUBSCRIPTION", **{f"subscription.{f.name}": f.cli.flag for f in WITH_FLAG if f.cli},
                 **PUSH_FLAGS, **POLICY_FLAGS, **DELTA_FLAGS,  # the flags' own check (_delta_config) and the client's
                 **{f"subscription.{k}": v for k, v in DELTA_FLAGS.items()}})
    u.add_argument("name", metavar="SUBSCRIPTION")
    field_options(u, update=True)
    policy_options(u, update=True)
    delta_options(u, update=True)
    mode = u.add_mutually_exclusive_group()
    mode.add_argument("--pull", action="store_true", help="turn into a pull subscription")
    push_options(u, endpoint=mode)
    d = command(sa, "delete", "delete a subscription and its messages", {"subscription": "SUBSCRIPTION"})
    d.add_argument("name", metavar="SUBSCRIPTION")
    dt = command(sa, "detach", "detach a subscription from its topic: it stays, shown detached, its messages are "
                 "dropped and it gets no more (pull and acks on it then fail)", {"subscription": "SUBSCRIPTION"})
    dt.add_argument("name", metavar="SUBSCRIPTION")
    s.set_defaults(func=cmd_subscriptions)

    n = command(cmds, "snapshots", "create, list, get, update or delete snapshots (for seek)")
    na = n.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = command(na, "create", "snapshot a subscription: its unacked messages now, and every message published after "
                "(expires when its oldest unacked message is 7 days old)",
                {"name": "SNAPSHOT", "subscription": "--subscription", "labels": "--label"})
    c.add_argument("name", metavar="SNAPSHOT")
    c.add_argument("--subscription", required=True, metavar="SUBSCRIPTION")
    c.add_argument("--label", action="append", metavar="KEY=VALUE")
    command(na, "list", "list the project's snapshots")
    g = command(na, "get", "show one snapshot as JSON", {"snapshot": "SNAPSHOT"})
    g.add_argument("name", metavar="SNAPSHOT")
    u = command(na, "update", "replace a snapshot's labels", {"snapshot.name": "SNAPSHOT", "snapshot.labels": "--label"})
    u.add_argument("name", metavar="SNAPSHOT")
    u.add_argument("--label", action="append", required=True, metavar="KEY=VALUE", help="the new labels (replace all of them)")
    d = command(na, "delete", "delete a snapshot", {"snapshot": "SNAPSHOT"})
    d.add_argument("name", metavar="SNAPSHOT")
    n.set_defaults(func=cmd_snapshots)

    sk = command(cmds, "seek", "seek a subscription to a time or a snapshot: what it counts as acked or unacked is "
                 "replaced; outstanding messages are delivered again and acks of earlier deliveries no longer apply",
                 {"subscription": "SUBSCRIPTION", "time": "--time", "snapshot": "--snapshot"})
    sk._negative_number_matcher = RELATIVE_TIME  # `--time -1h` is a value, not an unknown option
    sk.add_argument("subscription", metavar="SUBSCRIPTION")
    to = sk.add_mutually_exclusive_group(required=True)
    to.add_argument("--time", metavar="TIME", help="an RFC 3339 time (2026-11-26T12:00:00Z) or a duration back from now "
                    "(-1h, -30m, -2d): messages published before it count as acked; acked ones after it come back "
                    "if the topic's retention or --retain-acked kept them")
    to.add_argument("--snapshot", metavar="SNAPSHOT", help="a snapshot of the subscription's topic: exactly its unacked "
                    "messages and every message published after it are unacked")
    sk.set_defaults(func=cmd_seek)

    pb = command(cmds, "publish", "publish messages from arguments or a JSON-lines file", {"topic": "TOPIC"}, epilog=JSONL_HELP)
    pb.add_argument("topic", metavar="TOPIC")
    pb.add_argument("data", nargs="*", metavar="DATA", help="message data (text), one message each")
    pb.add_argument("--file", metavar="FILE", help="JSON lines, one message each (see below); - for stdin")
    pb.add_argument("--attribute", action="append", metavar="KEY=VALUE", help="an attribute of every message")
    pb.add_argument("--ordering-key", default="", metavar="KEY", help="the ordering key of every message")
    pb.add_argument("--quiet", action="store_true", help="no progress bar")
    pb.set_defaults(func=cmd_publish)

    pl = command(cmds, "pull", "pull messages (JSON lines on stdout)",
                 {"subscription": "SUBSCRIPTION", "max_messages": "--max-messages", "timeout": "--wait"})
    pl.add_argument("subscription", metavar="SUBSCRIPTION")
    pl.add_argument("--max-messages", type=int, default=10, metavar="N", help="1..10000 (default 10)")
    pl.add_argument("--ack", action="store_true", help="acknowledge what was pulled")
    pl.add_argument("--wait", type=_seconds, default=0, metavar="SECONDS", help="wait this long for a message (default: return at once)")
    pl.set_defaults(func=cmd_pull)

    sv = command(cmds, "serve", "serve the Pub/Sub gRPC API (google.pubsub.v1) on the warehouse: set "
                 "PUBSUB_EMULATOR_HOST=HOST:PORT and Google's client libraries use it unchanged; SIGTERM or Ctrl-C stops it",
                 {"port": "--port", "host": "--host", "tls_cert": "--tls-cert", "tls_key": "--tls-key", "insecure": "--insecure",
                  "defer_seconds": "--defer-seconds"})
    sv.add_argument("--port", type=int, required=True, metavar="PORT", help="0..65535 (0: a free port, shown in the ready line)")
    sv.add_argument("--host", default="127.0.0.1", metavar="HOST",
                    help="address to listen on (default 127.0.0.1); any other than loopback needs TLS or --insecure")
    sv.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain (with --tls-key)")
    sv.add_argument("--tls-key", metavar="FILE", help="PEM private key (with --tls-cert)")
    sv.add_argument("--insecure", action="store_true", help="allow plain text on a non-loopback --host")
    sv.add_argument("--allow-http", action="store_true", help="allow push subscriptions with plain http endpoints (localhost, tests)")
    sv.add_argument("--no-history", action="store_true",
                    help="do not record the delivery history (leases, acks, nacks, expiries) of the calls it serves")
    sv.add_argument("--defer-seconds", type=float, default=0.5, metavar="SECONDS",
                    help="the longest an ack answered from the server's journal waits before it is committed (default 0.5; "
                         "0 < s <= 60); only acks whose leases run 5 s past it are journaled")
    sv.set_defaults(func=cmd_serve)

    b = command(cmds, "backlog", "each subscription's backlog as a table (and rewrite the backlog table)")
    b.set_defaults(func=cmd_backlog)

    m = command(cmds, "maintenance", "apply retention (expired subscriptions, snapshots and messages), then compact small files, checkpoint and vacuum every table")
    m.add_argument("--retention-hours", type=int, default=168, metavar="HOURS",
                   help="vacuum files no version of the last N hours needs (default 168 = 7 days, the change feed's horizon)")
    m.add_argument("--history-retention-days", type=int, default=7, metavar="DAYS",
                   help="keep the delivery history (delivery_attempts) of the last N days (default 7); older days are deleted")
    m.set_defaults(func=cmd_maintenance)
    return p


def _resolve_globals(args: argparse.Namespace, environ: Mapping[str, str] | None) -> None:
    """The settings of the global options, resolved once: flag, then environment, then default.

    The environment is read through ``config`` only (`environ` None: this process's); the
    clients the commands make get the same resolved ``ClientSettings``. A bad variable is an
    ``InvalidArgument`` naming it."""
    from . import config

    defaults = config.client_defaults(environ)
    args.client_settings = defaults
    args.env_allow_http = defaults.allow_http
    if args.warehouse is not None:
        args.warehouse_source = "--warehouse"
    elif defaults.warehouse:
        args.warehouse, args.warehouse_source = defaults.warehouse, "$DELTABUS_WAREHOUSE"
    else:
        args.warehouse, args.warehouse_source = "./warehouse", "--warehouse"
    if args.project is not None:
        args.project_source = "--project"
    else:
        env_project = config.project_default(environ)
        args.project = env_project or "local"
        args.project_source = "$DELTABUS_PROJECT" if env_project else "--project"


def _trailing_data(extra: list[str]) -> list[str] | None:
    """`publish`'s DATA that argparse left over after an option, or None when `extra` holds an
    unknown option. Everything after a ``--`` is data, even when it starts with '-'
    (`publish T --attribute k=v -- -1`; argparse leaves the ``--`` in `extra`, so that was
    refused as an unrecognized argument)."""
    head, tail = extra, []
    if "--" in extra:
        cut = extra.index("--")
        head, tail = extra[:cut], extra[cut + 1 :]
    if any(a.startswith("-") for a in head):
        return None
    return head + tail


def _fail(message: str) -> int:
    print(f"deltabus: error: {' '.join(message.split())}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None, out: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        trailing = _trailing_data(extra) if extra and getattr(args, "func", None) is cmd_publish else None
        if trailing is not None:
            args.data += trailing  # DATA after an option: `publish T --attribute k=v hello` (argparse stops at the option)
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as exc:
        return _fail(f"{exc.message} (see '{exc.prog} --help')")
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    try:
        _resolve_globals(args, environ)
    except InvalidArgument as exc:  # a bad DELTABUS_* variable: named as it is
        return _fail(f"{exc.field}: {exc.rule}")
    flags = {"warehouse": args.warehouse_source, "project": args.project_source, **args.flags}
    try:
        from . import names

        names.parse_project(args.project)
        args.func(args, out or sys.stdout)
    except WarehouseNotFound as exc:
        return _fail(f"no warehouse at {exc.name} (from {args.warehouse_source}); "
                     "create one with 'deltabus init' or 'deltabus topics create'")
    except LineError as exc:  # names its file and line already
        return _fail(f"{exc.field}: {exc.rule}")
    except InvalidArgument as exc:
        return _fail(f"{_flag(exc.field, flags)}: {exc.rule}")
    except DeltabusError as exc:
        return _fail(str(exc))
    except _Interrupted as exc:
        print(f"deltabus: interrupted: {exc}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print("deltabus: interrupted", file=sys.stderr)
        return INTERRUPTED
    except OSError as exc:
        return _fail(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
