"""The ``deltabus`` command line: topics, subscriptions, publish, pull, backlog.

Names may be full (projects/P/topics/T) or short ids, expanded with --project
(default: $DELTABUS_PROJECT or "local"). Errors are one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Any, Callable, Iterator, Sequence, TextIO

from .errors import DeltabusError, InvalidArgument

BATCH = 1000


def _topic(args: argparse.Namespace, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{args.project}/topics/{name}"


def _sub(args: argparse.Namespace, name: str) -> str:
    return name if name.startswith("projects/") else f"projects/{args.project}/subscriptions/{name}"


def _labels(pairs: Sequence[str] | None, flag: str = "--label") -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise InvalidArgument(flag, f"expected KEY=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        out[k] = v
    return out


def _push_config(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.push_endpoint is None:
        if args.oidc_service_account or args.no_wrapper or args.write_metadata:
            raise InvalidArgument("--push-endpoint", "push options need --push-endpoint")
        return None
    cfg: dict[str, Any] = {"push_endpoint": args.push_endpoint}
    if args.oidc_service_account:
        cfg["oidc_token"] = {"service_account_email": args.oidc_service_account, "audience": args.oidc_audience or ""}
    if args.no_wrapper or args.write_metadata:
        cfg["no_wrapper"] = {"write_metadata": bool(args.write_metadata)}
    return cfg


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _subscription_dict(s: Any) -> dict[str, Any]:
    pc = s.push_config
    return {
        "name": s.name,
        "topic": s.topic,
        "ack_deadline_seconds": s.ack_deadline_seconds,
        "push_endpoint": pc.push_endpoint,
        "oidc_service_account": pc.oidc_token.service_account_email if pc.oidc_token else "",
        "oidc_audience": pc.oidc_token.audience if pc.oidc_token else "",
        "no_wrapper": pc.no_wrapper is not None,
        "write_metadata": bool(pc.no_wrapper and pc.no_wrapper.write_metadata),
        "labels": dict(s.labels),
    }


# -- commands --------------------------------------------------------------------------------
def cmd_topics(args: argparse.Namespace, out: TextIO) -> None:
    from . import PublisherClient

    pub = PublisherClient(warehouse=args.warehouse)
    if args.action == "create":
        t = pub.create_topic(name=_topic(args, args.name), labels=_labels(args.label))
        print(f"created topic {t.name}", file=out)
    elif args.action == "list":
        rows = [{"name": t.name, "labels": ",".join(f"{k}={v}" for k, v in t.labels.items())} for t in pub.list_topics(project=args.project)]
        print(_table(rows, ["name", "labels"]), file=out)
    elif args.action == "delete":
        pub.delete_topic(topic=_topic(args, args.name))
        print(f"deleted topic {_topic(args, args.name)}", file=out)


def cmd_subscriptions(args: argparse.Namespace, out: TextIO) -> None:
    from . import SubscriberClient

    sub = SubscriberClient(warehouse=args.warehouse, allow_http=getattr(args, "allow_http", None) or None)
    if args.action == "create":
        s = sub.create_subscription(
            name=_sub(args, args.name), topic=_topic(args, args.topic), push_config=_push_config(args),
            ack_deadline_seconds=args.ack_deadline, labels=_labels(args.label),
        )
        print(f"created {'push' if s.push_config.is_push else 'pull'} subscription {s.name}", file=out)
    elif args.action == "list":
        rows = [_subscription_dict(s) for s in sub.list_subscriptions(project=args.project)]
        print(_table(rows, ["name", "topic", "ack_deadline_seconds", "push_endpoint"]), file=out)
    elif args.action == "get":
        print(json.dumps(_subscription_dict(sub.get_subscription(subscription=_sub(args, args.name))), indent=2), file=out)
    elif args.action == "update":
        name = _sub(args, args.name)
        body: dict[str, Any] = {"name": name}
        mask = []
        if args.ack_deadline is not None:
            body["ack_deadline_seconds"] = args.ack_deadline
            mask.append("ack_deadline_seconds")
        if args.label is not None:
            body["labels"] = _labels(args.label)
            mask.append("labels")
        if args.pull:
            body["push_config"] = {}
            mask.append("push_config")
        elif args.push_endpoint is not None:
            body["push_config"] = _push_config(args)
            mask.append("push_config")
        if not mask:
            raise InvalidArgument("update", "nothing to change: give --ack-deadline, --label, --push-endpoint or --pull")
        s = sub.update_subscription(subscription=body, update_mask=mask)
        print(f"updated {s.name}: {', '.join(mask)}", file=out)
    elif args.action == "delete":
        sub.delete_subscription(subscription=_sub(args, args.name))
        print(f"deleted subscription {_sub(args, args.name)}", file=out)


def _jsonl(path: str) -> Iterator[dict[str, Any]]:
    f = sys.stdin if path == "-" else open(path, encoding="utf-8")
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"{path}:{n}", f"not valid JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise InvalidArgument(f"{path}:{n}", "each line must be a JSON object")
            unknown = set(obj) - {"data", "data_base64", "attributes", "ordering_key"}
            if unknown:
                raise InvalidArgument(f"{path}:{n}", f"unknown fields {sorted(unknown)}; use data or data_base64, attributes, ordering_key")
            if "data_base64" in obj:
                data = base64.b64decode(obj["data_base64"], validate=True)
            else:
                data = str(obj.get("data", "")).encode("utf-8")
            yield {"data": data, "attributes": obj.get("attributes") or {}, "ordering_key": obj.get("ordering_key", "")}


def cmd_publish(args: argparse.Namespace, out: TextIO) -> None:
    from . import PublisherClient

    pub = PublisherClient(warehouse=args.warehouse)
    topic = _topic(args, args.topic)
    attrs = _labels(args.attribute, "--attribute")
    if args.file is None:
        if not args.data:
            raise InvalidArgument("data", "give message data as arguments, or --file FILE.jsonl")
        ids = pub.publish_batch(topic, [{"data": d.encode(), "attributes": attrs, "ordering_key": args.ordering_key} for d in args.data])
        for i in ids:
            print(i, file=out)
        return
    from tqdm import tqdm

    # Validate every line before the first commit, so a bad line writes nothing.
    messages = list(_jsonl(args.file))
    for m in messages:
        m["attributes"] = {**attrs, **m["attributes"]}
    from .validation import check_message

    for n, m in enumerate(messages, 1):
        check_message(m["data"], m["attributes"], m["ordering_key"], where=f"{args.file}:{n}")
    total = 0
    with tqdm(total=len(messages), unit="msg", file=sys.stderr, disable=len(messages) < 10 * BATCH or args.quiet) as bar:
        for start in range(0, len(messages), BATCH):
            chunk = messages[start : start + BATCH]
            total += len(pub.publish_batch(topic, chunk))
            bar.update(len(chunk))
    print(f"published {total} messages to {topic}", file=out)


def cmd_pull(args: argparse.Namespace, out: TextIO) -> None:
    from . import SubscriberClient

    sub = SubscriberClient(warehouse=args.warehouse)
    name = _sub(args, args.subscription)
    got = sub.pull(subscription=name, max_messages=args.max_messages, return_immediately=args.wait == 0, timeout=args.wait or None).received_messages
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


def cmd_backlog(args: argparse.Namespace, out: TextIO) -> None:
    from . import SubscriberClient

    sub = SubscriberClient(warehouse=args.warehouse)
    figures = {b.subscription: b for b in sub.refresh_backlog()}  # also what `select ... from backlog` shows
    rows = []
    for s in sub.list_subscriptions(project=args.project):
        b = figures[s.name]
        rows.append({
            "subscription": s.name, "type": "push" if s.push_config.is_push else "pull",
            "undelivered": b.num_undelivered_messages, "outstanding": b.num_outstanding_messages,
            "expired": b.expired_ack_deadlines, "oldest_unacked_s": f"{b.oldest_unacked_message_age:.1f}",
        })
    print(_table(rows, ["subscription", "type", "undelivered", "outstanding", "expired", "oldest_unacked_s"]), file=out)


def cmd_maintenance(args: argparse.Namespace, out: TextIO) -> None:
    from .storage.maintenance import maintain_warehouse

    rows = maintain_warehouse(args.warehouse, retention_hours=args.retention_hours)
    print(_table(rows, ["table", "files_before", "files_after", "vacuumed", "compactions_skipped", "version"]), file=out)


# -- parser ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--warehouse", default=os.environ.get("DELTABUS_WAREHOUSE", "./warehouse"), help="warehouse path or URI (default: $DELTABUS_WAREHOUSE or ./warehouse)")
    common.add_argument("--project", default=os.environ.get("DELTABUS_PROJECT", "local"), help="project for short names (default: $DELTABUS_PROJECT or local)")

    p = argparse.ArgumentParser(prog="deltabus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    cmds = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = cmds.add_parser("topics", help="create, list or delete topics", parents=[common])
    ta = t.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = ta.add_parser("create", help="create a topic", parents=[common])
    c.add_argument("name")
    c.add_argument("--label", action="append", metavar="KEY=VALUE")
    ta.add_parser("list", help="list the project's topics", parents=[common])
    d = ta.add_parser("delete", help="delete a topic (its subscriptions keep what they hold)", parents=[common])
    d.add_argument("name")
    t.set_defaults(func=cmd_topics)

    def push_options(q: argparse.ArgumentParser) -> None:
        q.add_argument("--push-endpoint", metavar="URL", help="push to this https URL (empty: pull)")
        q.add_argument("--oidc-service-account", metavar="EMAIL", help="sign pushes with a JWT for this service account")
        q.add_argument("--oidc-audience", metavar="AUD", help="the JWT audience (default: the endpoint URL)")
        q.add_argument("--no-wrapper", action="store_true", help="push the raw data as the body")
        q.add_argument("--write-metadata", action="store_true", help="with --no-wrapper: message metadata in headers")
        q.add_argument("--allow-http", action="store_true", help="allow a plain http:// endpoint (localhost, tests)")

    s = cmds.add_parser("subscriptions", help="create, list, get, update or delete subscriptions", parents=[common])
    sa = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = sa.add_parser("create", help="create a subscription", parents=[common])
    c.add_argument("name")
    c.add_argument("--topic", required=True)
    c.add_argument("--ack-deadline", type=int, metavar="SECONDS", help="10..600 (default 10)")
    c.add_argument("--label", action="append", metavar="KEY=VALUE")
    push_options(c)
    sa.add_parser("list", help="list the project's subscriptions", parents=[common])
    g = sa.add_parser("get", help="show one subscription as JSON", parents=[common])
    g.add_argument("name")
    u = sa.add_parser("update", help="change the ack deadline, labels or push configuration", parents=[common])
    u.add_argument("name")
    u.add_argument("--ack-deadline", type=int, metavar="SECONDS")
    u.add_argument("--label", action="append", metavar="KEY=VALUE", help="replace the labels")
    u.add_argument("--pull", action="store_true", help="turn into a pull subscription")
    push_options(u)
    d = sa.add_parser("delete", help="delete a subscription and its messages", parents=[common])
    d.add_argument("name")
    s.set_defaults(func=cmd_subscriptions)

    pb = cmds.add_parser("publish", help="publish messages from arguments or a JSON-lines file", parents=[common])
    pb.add_argument("topic")
    pb.add_argument("data", nargs="*", help="message data (UTF-8 text), one message each")
    pb.add_argument("--file", metavar="FILE", help='JSON lines: {"data": "text" | "data_base64": "...", "attributes": {...}, "ordering_key": "..."}; - for stdin')
    pb.add_argument("--attribute", action="append", metavar="KEY=VALUE", help="an attribute for every message")
    pb.add_argument("--ordering-key", default="")
    pb.add_argument("--quiet", action="store_true", help="no progress bar")
    pb.set_defaults(func=cmd_publish)

    pl = cmds.add_parser("pull", help="pull messages (JSON lines on stdout)", parents=[common])
    pl.add_argument("subscription")
    pl.add_argument("--max-messages", type=int, default=10)
    pl.add_argument("--ack", action="store_true", help="acknowledge what was pulled")
    pl.add_argument("--wait", type=float, default=0, metavar="SECONDS", help="wait this long for a message (default: return at once)")
    pl.set_defaults(func=cmd_pull)

    b = cmds.add_parser("backlog", help="each subscription's backlog as a table (and rewrite the backlog table)", parents=[common])
    b.set_defaults(func=cmd_backlog)

    m = cmds.add_parser("maintenance", help="compact small files, checkpoint and vacuum every table", parents=[common])
    m.add_argument("--retention-hours", type=int, default=168,
                   help="vacuum files no version of the last N hours needs (default 168 = 7 days, the change feed's horizon)")
    m.set_defaults(func=cmd_maintenance)
    return p


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args, out or sys.stdout)
    except DeltabusError as exc:
        print(f"deltabus: error: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"deltabus: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
