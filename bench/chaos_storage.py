"""Chaos scenarios on storage (issue 16, scenarios 5 and 6): a full disk, and damaged state.

- ``disk(scratch, messages)``: a warehouse on a small tmpfs (``mount -t tmpfs``; needs root,
  else RuntimeError). A publisher and a pull/ack loop run until writes fail with ENOSPC.
  Checked: every error is ``StorageFull`` naming "no space left on device" and the table's
  path; while full, every table reads, every message whose publish returned is in
  ``messages``, and the backlog agrees with what was acked; ``deltabus maintenance`` on the
  full disk and after it is given space back (``mount -o remount,size=...``) fails cleanly or
  works, and corrupts nothing; then publishing and pulling resume and every stored message
  is delivered and acked (0 lost, 0 acked-then-redelivered). Unmounted in a finally.
- ``damaged(scratch, messages)``: a push subscription to an endpoint that acks, and
  ``jobs/deliver.py --until-idle`` run after each damage: (a) the push job's latest streaming
  checkpoint offsets file truncated to 0 bytes, then its latest commits file cut in half;
  (b) the whole streaming checkpoint deleted; (c) the ``_delta_log/*.checkpoint.parquet``
  files of ``deliveries`` and ``messages`` removed (``_last_checkpoint`` left pointing at
  them), then the clients and the job used. Each step publishes a fresh batch first; every
  message must reach the endpoint and be acked (0 lost; duplicates counted), or the job must
  stop with a one-line error naming the path and the fix.

Each returns figures and ``ok``; ``unexpected_lines`` holds tracebacks from logs that should
have none. The harness is not a test: tests/integration/test_chaos_storage.py runs it small.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "lib")):
    if p not in sys.path:
        sys.path.insert(0, p)

from bench.chaos import PROJECT, _tail, _unexpected_lines, start_job, stop_group  # noqa: E402
from bench.chaos_check import check_pushes, is_ack  # noqa: E402
from bench.chaos_endpoint import ChaosEndpoint, EndpointSettings  # noqa: E402

ACK_DEADLINE = 10
TABLES = ("topics", "subscriptions", "messages", "deliveries", "backlog", "snapshots")
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|panicked at")


def log(msg: str) -> None:
    print(f"[chaos-storage {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def _maintenance(wh: str) -> dict[str, Any]:
    """`deltabus maintenance` in its own process, as a user runs it."""
    p = subprocess.run([sys.executable, "-m", "deltabus.cli", "maintenance", "--warehouse", wh], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "lib")})
    out = (p.stdout + p.stderr).strip()
    return {"rc": p.returncode, "stderr": p.stderr.strip()[-400:], "traceback": bool(re.search(r"Traceback \(most recent", out))}


def _tables_readable(wh: str) -> dict[str, Any]:
    """Open and fully read every table with a fresh handle: (table -> rows) or the error."""
    from deltalake import DeltaTable

    out: dict[str, Any] = {}
    for t in TABLES:
        path = f"{wh}/{t}"
        if not os.path.isdir(path):
            continue
        try:
            out[t] = DeltaTable(path).to_pyarrow_table().num_rows
        except Exception as exc:  # reported, not raised: a table that does not read is the finding
            out[t] = f"ERROR {type(exc).__name__}: {str(exc)[:200]}"
    return out


def _message_ids(wh: str) -> set[str]:
    from deltalake import DeltaTable

    return set(DeltaTable(f"{wh}/messages").to_pyarrow_table(columns=["message_id"])["message_id"].to_pylist())


def _clear(exc: BaseException, wh: str) -> bool:
    """The error a user sees on a full disk: StorageFull, saying so, naming the table's path."""
    from deltabus.errors import StorageFull

    text = str(exc)
    return isinstance(exc, StorageFull) and "no space left on device" in text and wh in text and "\x1b" not in text


def _mount(mnt: Path, mib: int) -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    p = _run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(mnt)])
    if p.returncode != 0:
        raise RuntimeError(f"cannot mount a tmpfs at {mnt} (needs root): {(p.stderr or p.stdout).strip()}")


def _remount(mnt: Path, mib: int) -> None:
    p = _run(["mount", "-o", f"remount,size={mib}m", str(mnt)])
    if p.returncode != 0:
        raise RuntimeError(f"cannot remount {mnt}: {(p.stderr or p.stdout).strip()}")


def _umount(mnt: Path) -> None:
    if _run(["umount", str(mnt)]).returncode != 0:
        _run(["umount", "-l", str(mnt)])


# -- scenario 5: a full disk ---------------------------------------------------------------------
def disk(scratch: Path, messages: int, *, small_mib: int = 3, big_mib: int = 64) -> dict[str, Any]:
    """`messages`: about twice what fits on the small disk (the payload is sized so)."""
    from deltabus import PublisherClient, SubscriberClient

    mnt = scratch / "disk"
    _mount(mnt, small_mib)
    wh = str(mnt / "warehouse")
    out: dict[str, Any] = {"messages": messages, "small_mib": small_mib, "big_mib": big_mib}
    errors: list[dict[str, Any]] = []
    published: list[str] = []
    acked: set[str] = set()
    received: dict[str, int] = {}
    pub = sub = None
    try:
        pub = PublisherClient(warehouse=wh)
        sub = SubscriberClient(warehouse=wh)
        topic = pub.topic_path(PROJECT, "disk")
        sp = sub.subscription_path(PROJECT, "disk")
        pub.create_topic(name=topic)
        sub.create_subscription(name=sp, topic=topic, ack_deadline_seconds=ACK_DEADLINE)
        payload = b"d" * max(256, small_mib * 2**20 * 2 // messages)

        def pull_ack(n: int) -> int:
            assert sub is not None
            try:
                r = sub.pull(subscription=sp, max_messages=n, return_immediately=True)
            except Exception as exc:
                errors.append({"op": "pull", "type": type(exc).__name__, "msg": str(exc)[:300], "clear": _clear(exc, wh)})
                return -1
            for m in r.received_messages:
                received[m.message.message_id] = received.get(m.message.message_id, 0) + 1
            ids = [m.ack_id for m in r.received_messages]
            if not ids:
                return 0
            try:
                sub.acknowledge(subscription=sp, ack_ids=ids)
                acked.update(m.message.message_id for m in r.received_messages)
            except Exception as exc:
                errors.append({"op": "ack", "type": type(exc).__name__, "msg": str(exc)[:300], "clear": _clear(exc, wh)})
            return len(ids)

        # Fill the disk: publish batches of 10, pull and ack 5, until writes fail (and a few
        # rounds more, so pulls and acks meet the full disk too).
        full_rounds = 0
        for i in range(messages):  # at most; the disk fills long before
            try:
                published += pub.publish_batch(topic, [{"data": payload, "attributes": {"i": str(i * 10 + j)}} for j in range(10)])
            except Exception as exc:
                errors.append({"op": "publish", "type": type(exc).__name__, "msg": str(exc)[:300], "clear": _clear(exc, wh)})
                full_rounds += 1
            pull_ack(5)
            if full_rounds >= 5:
                break
        out["published_before_full"] = len(published)
        out["acked_before_full"] = len(acked)
        log(f"disk: full after {len(published)} published, {len(acked)} acked; {len(errors)} errors")

        # While full: everything reads, the table holds every returned publish, the backlog agrees.
        out["maintenance_full"] = _maintenance(wh)
        out["readable_full"] = _tables_readable(wh)
        stored = _message_ids(wh)
        out["missing_published_full"] = len(set(published) - stored)
        out["stored_unreturned_publishes"] = len(stored - set(published))  # publishes that raised yet landed
        left_full = sub.get_backlog(sp).num_unacked_messages
        out["backlog_full"] = left_full
        out["backlog_agrees_full"] = left_full == len(stored - acked)

        # Space returns.
        _remount(mnt, big_mib)
        out["maintenance_after"] = _maintenance(wh)
        more = pub.publish_batch(topic, [{"data": payload, "attributes": {"after": "1"}} for _ in range(10)])
        published += more
        deadline = time.time() + 3 * ACK_DEADLINE + 10
        empty_since = None
        while time.time() < deadline:  # leases granted by pulls that failed after committing come back after their deadline
            n = pull_ack(100)
            if n == 0 and sub.get_backlog(sp).num_unacked_messages == 0:
                break
            if n <= 0:
                empty_since = empty_since or time.time()
                time.sleep(0.5)
        stored = _message_ids(wh)
        out["readable_after"] = _tables_readable(wh)
        out["published"] = len(published)
        out["stored"] = len(stored)
        out["lost"] = len(stored - acked)
        out["lost_returned_publishes"] = len(set(published) - acked)
        out["duplicates"] = sum(c - 1 for c in received.values())
        out["backlog_after"] = sub.get_backlog(sp).num_unacked_messages
    finally:
        for c in (sub, pub):
            if c is not None:
                try:
                    c.close()
                except Exception:  # closing on a full disk may fail; the result says what matters
                    pass
        _umount(mnt)
    out["errors"] = len(errors)
    out["errors_by_op"] = {op: sum(1 for e in errors if e["op"] == op) for op in ("publish", "pull", "ack")}
    out["unclear_errors"] = [e for e in errors if not e["clear"]][:5]
    out["first_error"] = errors[0]["msg"] if errors else None
    unreadable = [t for r in (out["readable_full"], out["readable_after"]) for t, v in r.items() if isinstance(v, str)]
    out["unreadable_tables"] = unreadable
    out["unexpected_lines"] = [f"maintenance {k}: {out[k]['stderr']}" for k in ("maintenance_full", "maintenance_after")
                               if out[k]["traceback"]]
    out["ok"] = (bool(errors) and not out["unclear_errors"] and not unreadable and out["missing_published_full"] == 0
                 and out["backlog_agrees_full"] and out["lost"] == 0 and out["backlog_after"] == 0
                 and out["maintenance_after"]["rc"] == 0 and not out["unexpected_lines"])
    return out


# -- scenario 6: damaged state -------------------------------------------------------------------
def _latest(folder: Path) -> Path | None:
    files = [f for f in folder.glob("*") if f.name.isdigit()] if folder.is_dir() else []
    return max(files, key=lambda f: int(f.name)) if files else None


def _remove_log_checkpoints(table: Path) -> list[str]:
    """Remove the table's checkpoint parquet files; `_last_checkpoint` still names the latest."""
    gone = []
    for f in sorted((table / "_delta_log").glob("*.checkpoint*.parquet")):
        f.unlink()
        gone.append(f.name)
    return gone


STEPS = ("offsets truncated", "commits halved", "checkpoint deleted", "delta log checkpoints removed", "last checkpoint hint deleted")


def damaged(scratch: Path, messages: int, steps_wanted: tuple[str, ...] = STEPS) -> dict[str, Any]:
    """`messages` per step: a clean run, then each of `steps_wanted` (in STEPS' order; the
    last needs the one before it)."""
    from deltabus import PublisherClient, SubscriberClient
    from deltalake import DeltaTable

    wh = str(scratch / "warehouse")
    ckpt = Path(wh) / "_checkpoints" / "deliver"
    job_log = scratch / "deliver.log"
    pub = PublisherClient(warehouse=wh)
    sub = SubscriberClient(warehouse=wh, allow_http=True)
    topic = pub.topic_path(PROJECT, "damaged")
    pub.create_topic(name=topic)
    pull_path = sub.subscription_path(PROJECT, "damaged-pull")
    steps: list[dict[str, Any]] = []
    published: list[str] = []
    events: list[float] = []
    out: dict[str, Any] = {"messages_per_step": messages}
    # refuse_seconds=0: the endpoint flushes its log only once its refusing port is up.
    with ChaosEndpoint(scratch / "endpoint", EndpointSettings(deadline=ACK_DEADLINE, refuse_seconds=0.0)) as ep:
        push_path = sub.subscription_path(PROJECT, "damaged-push")
        sub.create_subscription(request={"name": push_path, "topic": topic, "ack_deadline_seconds": ACK_DEADLINE,
                                         "push_config": {"push_endpoint": ep.url("ok")}})
        sub.create_subscription(name=pull_path, topic=topic, ack_deadline_seconds=ACK_DEADLINE)
        pulled: set[str] = set()

        def step(name: str, damage: Any) -> None:
            what = damage() if damage else None
            events.append(time.time())
            started = time.time()
            client_error = None
            try:
                ids = pub.publish_batch(topic, [{"data": b"x" * 64, "attributes": {"step": name, "i": str(i)}} for i in range(messages)])
                published.extend(ids)
                while True:  # the pull subscription through the client: must read the damaged table too
                    r = sub.pull(subscription=pull_path, max_messages=1000, return_immediately=True)
                    if not r.received_messages:
                        break
                    pulled.update(m.message.message_id for m in r.received_messages)
                    sub.acknowledge(subscription=pull_path, ack_ids=[m.ack_id for m in r.received_messages])
            except Exception as exc:
                client_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            mark = job_log.stat().st_size if job_log.exists() else 0
            job = start_job(wh, job_log, until_idle=True, max_seconds=120)
            try:
                rc = job.wait(150)
            except subprocess.TimeoutExpired:
                stop_group(job)
                rc = job.returncode
            text = job_log.read_text(errors="replace")[mark:]
            time.sleep(1.0)  # the endpoint's last lines flushed
            got = {r["m"] for r in ep.records() if r["sub"] == push_path and is_ack(r["st"])}
            errs = [ln for ln in text.splitlines() if ln.startswith("deliver:") and ("error" in ln.lower() or "delete" in ln.lower())]
            steps.append({"step": name, "damage": what, "job_rc": rc, "seconds": round(time.time() - started, 1),
                          "push_missing": len(set(published) - got), "client_error": client_error,
                          "job_error_lines": errs[:3], "tracebacks": len([ln for ln in text.splitlines() if TRACEBACK.search(ln)]),
                          # batches skipped as "already committed": a run on a NEW checkpoint must skip none
                          "skipped_batches": text.count("already committed before a restart; skipped")})
            log(f"damaged: {name}: {steps[-1]}")

        def truncate_offsets() -> str:
            f = _latest(ckpt / "offsets")
            assert f is not None, f"no streaming checkpoint at {ckpt}"
            f.write_bytes(b"")
            return f"{f.relative_to(wh)} truncated to 0 bytes"

        def halve_commits() -> str:
            f = _latest(ckpt / "commits")
            assert f is not None, f"no commits in {ckpt}"
            data = f.read_bytes()
            f.write_bytes(data[: len(data) // 2])
            return f"{f.relative_to(wh)} cut from {len(data)} to {len(data) // 2} bytes"

        def delete_checkpoint() -> str:
            import shutil

            shutil.rmtree(ckpt)
            return f"{ckpt.relative_to(wh)} deleted"

        def remove_log_checkpoints() -> str:
            gone = []
            for t in ("deliveries", "messages"):
                DeltaTable(f"{wh}/{t}").create_checkpoint()
                gone += [f"{t}/_delta_log/{g}" for g in _remove_log_checkpoints(Path(wh) / t)]
            return "removed " + ", ".join(gone)

        def delete_hint() -> str:  # what storage.log_repair does by itself when the hint names a missing checkpoint
            gone = []
            for t in ("deliveries", "messages"):
                hint = Path(wh) / t / "_delta_log" / "_last_checkpoint"
                if hint.exists():
                    hint.unlink()
                    gone.append(f"{t}/_delta_log/_last_checkpoint")
            return "deleted " + (", ".join(gone) or "nothing (already repaired)")

        damages = {"offsets truncated": truncate_offsets, "commits halved": halve_commits, "checkpoint deleted": delete_checkpoint,
                   "delta log checkpoints removed": remove_log_checkpoints, "last checkpoint hint deleted": delete_hint}
        step("clean", None)
        for name in STEPS:
            if name in steps_wanted:
                step(name, damages[name])
        time.sleep(1.0)
        records = [r for r in ep.records() if r["sub"] == push_path]
    figures = check_pushes(published, records, events)
    strict = check_pushes(published, records, [])
    out.update({"steps": steps, "published": len(published), "lost": figures["lost"], "duplicates": figures["duplicates"],
                "duplicates_per_step": figures["duplicates_per_kill"], "acked_then_redelivered": strict["acked_then_redelivered"],
                "unknown_ids": figures["unknown_ids"], "pull_lost": len(set(published) - pulled)})
    try:
        out["backlog_push"] = sub.get_backlog(push_path).num_unacked_messages
        out["backlog_pull"] = sub.get_backlog(pull_path).num_unacked_messages
    except Exception as exc:  # a table left damaged by the last step
        out["backlog_push"] = out["backlog_pull"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    out["unexpected_lines"] = [ln for ln in _unexpected_lines(job_log) if "Traceback" in ln][:5]
    out["stopped_with_traceback"] = [s["step"] for s in steps if s["job_rc"] != 0 and s["tracebacks"]]
    stopped_clearly = all(s["job_rc"] == 0 or (s["job_error_lines"] and s["tracebacks"] == 0) for s in steps)
    out["ok"] = (out["lost"] == 0 and out["pull_lost"] == 0 and stopped_clearly and not out["unexpected_lines"]
                 and out["acked_then_redelivered"] == 0 and out["unknown_ids"] == 0
                 and all(s["client_error"] is None for s in steps) and out["backlog_push"] == 0 and out["backlog_pull"] == 0)
    sub.close()
    pub.close()
    return out


def main() -> int:
    import argparse
    import shutil
    import tempfile

    p = argparse.ArgumentParser(prog="bench/chaos_storage.py")
    p.add_argument("--only", default="disk,damaged")
    p.add_argument("--messages", type=int, default=400)
    p.add_argument("--scratch", type=Path, help="scratch directory, kept (default: a new temp dir, removed)")
    a = p.parse_args()
    scratch = a.scratch or Path(tempfile.mkdtemp(prefix="deltabus-chaos-storage-"))
    result: dict[str, Any] = {}
    try:
        for name in a.only.split(","):
            d = scratch / name
            d.mkdir()
            result[name] = {"disk": disk, "damaged": damaged}[name](d, a.messages)
            print(name, json.dumps(result[name], default=str, indent=1), flush=True)
    finally:
        if a.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(r["ok"] for r in result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
