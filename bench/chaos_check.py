"""The chaos suite's invariants, checked from the endpoint's and the clients' own records. Pure.

Contract. Every function takes plain records (what ``chaos_endpoint`` wrote, what the
client processes wrote, the harness's kill times) and returns figures; nothing here reads
deltabus's tables, so a bug in them cannot hide a loss.

- ``check_pushes``: per push subscription, from the endpoint's records.
  - **lost**: published ids that never got a 2xx (102 counts too, as in Pub/Sub) from the
    endpoint. Zero is the guarantee.
  - **duplicates**: arrivals of an id after its first 2xx, each attributed to the last kill
    before it (``per_kill``) or to none.
  - **acked_then_redelivered**: arrivals after a *clean* 2xx (complete within the deadline:
    the pusher saw it, if it was still there) with no kill between that push's sending
    (its arrival less ``IN_FLIGHT``) and the redelivery (a kill while the push was in
    flight cut the pusher off from its answer).
    Zero is the guarantee ("no acked message is pushed again on purpose").
- ``check_pulls``: from pull clients' records (``Receipt`` with the time the pull call
  started, so the lease the server committed for it ends no earlier than that plus the
  deadline; ``Ack`` confirmed by the server).
  - **lost**: published ids never acked (confirmed).
  - **granted_twice**: a receipt of an id by any client before the lease of an earlier
    receipt could have ended (its pull's start + deadline), when the earlier one was not
    acked first. Sound: it never flags a correct run (the earlier lease was committed after
    its pull started, so it ends after that + deadline; the later grant was committed
    before its receipt).
  - **acked_then_redelivered**: a receipt after a confirmed ack of the id.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Iterable, NamedTuple, Sequence


# Seconds between a push leaving a (then killed) pusher and its handler starting at the
# endpoint. Measured in the 1M-message run of record: every push acked after a kill had
# reached the endpoint's handler at most 0.10 s after the kill's signal (1,757 of them,
# all sent before it: the job's processes are gone within milliseconds of SIGKILL).
IN_FLIGHT = 0.5


def is_ack(status: int) -> bool:
    return status == 102 or 200 <= status < 300


def check_pushes(published: Iterable[str], records: Sequence[dict[str, Any]], kills: Sequence[float]) -> dict[str, Any]:
    """The invariants of one push subscription (records of that subscription only)."""
    ids = set(published)
    kills = sorted(kills)
    by_id: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_id[r["m"]].append(r)
    acked = 0
    duplicates = 0
    per_kill: dict[int, int] = defaultdict(int)  # index of the kill (-1: before any kill)
    violations: list[dict[str, Any]] = []
    unknown = set(by_id) - ids
    for mid in ids:
        rs = sorted(by_id.get(mid, ()), key=lambda r: r["t0"])
        first_ack = next((r for r in rs if is_ack(r["st"])), None)
        if first_ack is None:
            continue
        acked += 1
        clean_acks = [(r["t0"], r["t1"]) for r in rs if is_ack(r["st"]) and r["clean"]]
        for r in rs:
            if r["t0"] <= first_ack["t0"]:
                continue
            duplicates += 1
            k = bisect.bisect_right(kills, r["t0"]) - 1
            per_kill[k] += 1
            before = [a for a in clean_acks if a[1] < r["t0"]]
            # Excused by a kill after the acked push was sent: it cut the pusher off from the
            # answer. A push reaches the endpoint's handler a little after it was sent, so a
            # kill up to IN_FLIGHT before the push's arrival counts too.
            if before and not any(before[-1][0] - IN_FLIGHT < k_t < r["t0"] for k_t in kills):
                violations.append({"m": mid, "acked_at": before[-1][1], "arrived_at": r["t0"]})
    return {
        "published": len(ids),
        "acked": acked,
        "lost": len(ids) - acked,
        "arrivals": sum(len(v) for v in by_id.values()),
        "duplicates": duplicates,
        "duplicates_per_kill": {str(k): v for k, v in sorted(per_kill.items())},
        "acked_then_redelivered": len(violations),
        "violations": violations[:20],
        "unknown_ids": len(unknown),
    }


class Receipt(NamedTuple):
    client: str
    message_id: str
    called: float  # when the pull call that returned it started
    received: float  # when it returned
    deadline: float  # the lease's length asked (seconds)


class Ack(NamedTuple):
    client: str
    message_id: str
    confirmed: float  # when the acknowledge call returned OK


def check_pulls(published: Iterable[str], receipts: Sequence[Receipt], acks: Sequence[Ack]) -> dict[str, Any]:
    ids = set(published)
    acked_at: dict[str, float] = {}
    for a in acks:
        acked_at[a.message_id] = min(a.confirmed, acked_at.get(a.message_id, a.confirmed))
    by_id: dict[str, list[Receipt]] = defaultdict(list)
    for r in receipts:
        by_id[r.message_id].append(r)
    twice: list[dict[str, Any]] = []
    redelivered: list[dict[str, Any]] = []
    duplicates = 0
    for mid, rs in by_id.items():
        rs.sort(key=lambda r: r.received)
        duplicates += len(rs) - 1
        first_ack = acked_at.get(mid)
        for i, later in enumerate(rs):
            if first_ack is not None and first_ack < later.called:
                redelivered.append({"m": mid, "acked_at": first_ack, "received_at": later.received, "client": later.client})
            for earlier in rs[:i]:
                ends = earlier.called + earlier.deadline
                acked_before = first_ack is not None and first_ack <= later.received
                if later.received < ends and not acked_before:
                    twice.append({"m": mid, "first": earlier.client, "second": later.client,
                                  "lease_ends_no_earlier_than": ends, "received_at": later.received})
    return {
        "published": len(ids),
        "acked": len(ids & set(acked_at)),
        "lost": len(ids - set(acked_at)),
        "receipts": len(receipts),
        "duplicates": duplicates,
        "granted_twice": len(twice),
        "acked_then_redelivered": len(redelivered),
        "violations": (twice + redelivered)[:20],
        "unknown_ids": len(set(by_id) - ids),
    }
