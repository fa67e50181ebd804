"""Group commit (server): which outcome of a message one round's MERGE applies, and who gets which lease.

Contract (pure; no clock, no tables):

- ``resolve(outcomes)``: a MERGE source may name a message once, but one round gathers the
  acks, nacks and deadline changes of every caller of a subscription, so one message can
  have several. Per message id the round keeps ONE: first only the requests naming the
  latest delivery attempt count (an older attempt's ack id can never apply: the row holds
  the newest delivery); among those an ack wins over any deadline change or nack (the
  message is done, so a lease change for it is moot); without an ack, the LAST deadline
  change in arrival order wins (a nack is a deadline change to 0), as if the calls had
  committed one after another in that order.
- ``result_of(item, winner, applied)``: the per-id answer a caller gets: its id shares
  the fate of the winning outcome when it names the same delivery; an id naming an older
  delivery is superseded (not applied).
- ``split(keys, wants)``: hands a round's leases (in lease order) to its lease callers
  (in arrival order), each up to the number it asked for; with message ordering all the
  leases of one ordering key go to ONE caller (the one that got the key's first lease),
  so a key's messages reach one stream and stay in order there. Such a group may exceed
  that caller's ask: the leases are already granted, so they are handed out rather than
  left to expire (the client holds the surplus; its flow control counts it).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class Outcome(NamedTuple):
    """One requested outcome, in arrival order: `seconds` None is an ack, 0 a nack, > 0 a
    deadline change to now + seconds."""

    message_id: str
    delivery_attempt: int
    seconds: float | None
    message_version: int | None = None  # the row version the ack id carries (None: any)


def resolve(outcomes: Sequence[Outcome]) -> dict[str, Outcome]:
    """The winning outcome per message id (see the module docstring), in first-seen order."""
    latest: dict[str, tuple[int, int | None]] = {}
    for o in outcomes:
        prev = latest.get(o.message_id)
        if prev is None or newer((o.delivery_attempt, o.message_version), prev):
            latest[o.message_id] = (o.delivery_attempt, o.message_version)
    won: dict[str, Outcome] = {}
    for o in outcomes:
        if (o.delivery_attempt, o.message_version) != latest[o.message_id]:
            continue
        held = won.get(o.message_id)
        if held is not None and held.seconds is None:
            continue  # an ack already won
        won[o.message_id] = o
    return won


def newer(a: tuple[int, int | None], b: tuple[int, int | None]) -> bool:
    """Whether delivery `a` (attempt, row version) is later than `b`. A row's version only ever
    goes down (each seek gives the rows it keeps or brings back an epoch below every version
    present, ``delivery.seek``), and a row a seek brought back starts its attempts again: so
    of two known, different versions the lower is the later row whatever the attempts; of
    one version (or where an id lacks it: the older ack-id format) the higher attempt is
    later, and on a tie the id with a version wins. Pure."""
    if a[1] is not None and b[1] is not None and a[1] != b[1]:
        return a[1] < b[1]
    if a[0] != b[0]:
        return a[0] > b[0]
    return a[1] is not None and b[1] is None


def result_of(item: Outcome, winner: Outcome | None, applied: bool) -> bool:
    """Whether `item` counts as applied: it names the winner's delivery and the winner applied."""
    return (
        winner is not None and applied and item.delivery_attempt == winner.delivery_attempt
        and (item.message_version is None or item.message_version == winner.message_version)
    )


def split(keys: Sequence[str], wants: Sequence[int]) -> list[list[int]]:
    """Indices of the leases (their ordering keys, "" for none, in lease order) each caller
    gets (callers in arrival order, `wants` the number each asked for)."""
    out: list[list[int]] = [[] for _ in wants]
    if not wants:
        return out
    owner: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key and key in owner:
            c = owner[key]
        else:
            c = next((j for j, w in enumerate(wants) if len(out[j]) < w), -1)
            if c < 0:  # only after a key's group overflowed its caller: the least loaded takes it
                c = min(range(len(wants)), key=lambda j: len(out[j]) - wants[j])
            if key:
                owner[key] = c
        out[c].append(i)
    return out
