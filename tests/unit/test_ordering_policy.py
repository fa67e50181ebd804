"""Ordering keys (issue 13): the pure rules on Arrow tables, and through lease selection."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from deltabus.delivery.hooks import DeliveryHooks, hooks_for
from deltabus.delivery.selection import select
from deltabus.delivery.merge import CASCADED_US
from deltabus.policy.ordering import NO_KEYS, KeyState, eligible, followers, ran_out
from deltabus.timestamps import TS

EXPIRES = 1_700_000_010_000_000


def avail(*rows: tuple[str, int, str]) -> pa.Table:
    """(message_id, message_version, ordering_key) available rows, in lease order."""
    return pa.table(
        {
            "message_id": pa.array([r[0] for r in rows], pa.string()),
            "message_version": pa.array([r[1] for r in rows], pa.int64()),
            "publish_time": pa.array([0] * len(rows), TS),
            "delivery_attempt": pa.array([1] * len(rows), pa.int32()),
            "lease_expires": pa.nulls(len(rows), TS),
            "ordering_key": pa.array([r[2] for r in rows], pa.string()),
        }
    )


def fresh(*rows: tuple[str, int, str | None]) -> pa.Table:
    return pa.table(
        {
            "message_id": pa.array([r[0] for r in rows], pa.string()),
            "publish_time": pa.array([0] * len(rows), TS),
            "ordering_key": pa.array([r[2] for r in rows], pa.string()),
            "size_bytes": pa.array([1] * len(rows), pa.int64()),
            "message_version": pa.array([r[1] for r in rows], pa.int64()),
        }
    )


def held(*keys: str, complete: bool = True) -> KeyState:
    return KeyState(pa.array(list(keys), pa.string()), complete)


def masks(a: pa.Table, f: pa.Table, state: KeyState, one: bool) -> tuple[list[bool], list[bool]]:
    ma, mf = eligible(a, f, state, one_per_key=one)
    return ma.to_pylist(), mf.to_pylist()


def test_pull_leases_a_free_keys_messages_in_order_and_none_of_a_held_key() -> None:
    a = avail(("a1", 1, "a"), ("b1", 1, "b"), ("a2", 2, "a"))
    f = fresh(("a3", 3, "a"), ("b2", 3, "b"), ("n", 3, ""), ("z", 3, None))
    assert masks(a, f, held("b"), one=False) == ([True, False, True], [True, False, True, True])
    assert masks(a, f, NO_KEYS, one=False) == ([True, True, True], [True, True, True, True])


def test_push_leases_one_per_key_and_keyless_messages_freely() -> None:
    a = avail(("a1", 1, "a"), ("b1", 1, "b"), ("a2", 2, "a"))
    f = fresh(("a3", 3, "a"), ("c1", 3, "c"), ("c2", 3, "c"), ("n1", 3, ""), ("n2", 3, ""))
    assert masks(a, f, held("b"), one=True) == ([True, False, False], [False, True, False, True, True])


def test_a_cut_available_read_holds_back_new_keyed_messages() -> None:
    # The read stopped at its limit: an older row of key "a" may be unread, so a3 must wait.
    a = avail(("a1", 1, "a"))
    f = fresh(("a3", 3, "a"), ("n", 3, ""))
    assert masks(a, f, held(complete=False), one=False) == ([True], [False, True])


def test_eligible_candidates_are_a_prefix_of_each_key_so_select_keeps_order() -> None:
    hooks = hooks_for_ordering()
    a = avail(("a1", 1, "a"), ("a2", 2, "a"), ("a3", 3, "a"))
    f = fresh(("a4", 4, "a"), ("b1", 4, "b"))
    got = select("s1", a, f, 2, EXPIRES, hooks, NO_KEYS)
    # room 2: a1, a2; a4 must not jump ahead of a3, and b1 gets no room either
    assert [lease.message_id for lease in got.leases] == ["a1", "a2"]
    got = select("s1", a, f, 5, EXPIRES, hooks, held("b"))
    assert [lease.message_id for lease in got.leases] == ["a1", "a2", "a3", "a4"]


def hooks_for_ordering() -> DeliveryHooks:
    from deltabus.delivery import hooks as h

    return DeliveryHooks(eligible=h._ordering_hooks[False])


def test_hooks_for_sets_eligibility_only_with_ordering() -> None:
    import dataclasses

    from deltabus.registry import SubscriptionRecord
    from deltabus.types import PushConfig

    base = SubscriptionRecord(name="projects/p/subscriptions/s", topic="projects/p/topics/t", sub_uid="u", topic_uid="t", start_version=0)
    assert hooks_for(base).eligible is None
    pull = hooks_for(dataclasses.replace(base, enable_message_ordering=True))
    push = hooks_for(dataclasses.replace(base, enable_message_ordering=True, push_config=PushConfig(push_endpoint="http://x")))
    a = avail(("a1", 1, "a"), ("a2", 2, "a"))
    assert pull.eligible is not None and push.eligible is not None
    assert pull.eligible(a, fresh(), NO_KEYS)[0].to_pylist() == [True, True]
    assert push.eligible(a, fresh(), NO_KEYS)[0].to_pylist() == [True, False]


def outstanding(*rows: tuple[str, int, str, int]) -> pa.Table:
    """(message_id, message_version, ordering_key, delivery_attempt)."""
    return pa.table(
        {
            "message_id": pa.array([r[0] for r in rows], pa.string()),
            "message_version": pa.array([r[1] for r in rows], pa.int64()),
            "ordering_key": pa.array([r[2] for r in rows], pa.string()),
            "delivery_attempt": pa.array([r[3] for r in rows], pa.int32()),
        }
    )


def nacks(*items: tuple[str, int]) -> pa.Table:
    return pa.table({"message_id": pa.array([m for m, _ in items], pa.string()),
                     "delivery_attempt": pa.array([a for _, a in items], pa.int32())})


def test_a_nack_ends_the_later_leases_of_its_key_only() -> None:
    rows = outstanding(("a1", 1, "a", 1), ("a2", 1, "a", 1), ("b1", 1, "b", 1), ("a0", 0, "a", 2), ("a3", 2, "a", 3), ("n", 1, "", 1))
    got = followers(nacks(("a1", 1)), rows)
    assert got["message_id"].to_pylist() == ["a2", "a3"]
    assert got["delivery_attempt"].to_pylist() == [1, 3]
    # two nacks of one key: the earliest decides, and the nacked ones are not repeated
    assert followers(nacks(("a2", 1), ("a1", 1)), rows)["message_id"].to_pylist() == ["a3"]
    # a nack naming an older delivery applies to nothing, so it ends nothing
    assert followers(nacks(("a1", 7)), rows).num_rows == 0
    assert followers(nacks(("n", 1)), rows).num_rows == 0
    assert followers(nacks(), rows).num_rows == 0


NOW_US = 1_700_000_000_000_000


def leased(*rows: tuple[str, int, str, int, int]) -> pa.Table:
    """(message_id, message_version, ordering_key, delivery_attempt, lease_expires us)."""
    return outstanding(*[r[:4] for r in rows]).append_column("lease_expires", pa.array([r[4] for r in rows], pa.int64()))


def test_a_lease_that_ran_out_ends_the_running_leases_after_it_in_its_key_only() -> None:
    later, past = NOW_US + 5_000_000, NOW_US - 1
    rows = leased(("a1", 1, "a", 1, past), ("a2", 1, "a", 1, later), ("a3", 2, "a", 2, later),
                  ("b1", 1, "b", 1, later), ("c1", 1, "c", 1, past), ("a0", 0, "a", 1, later))
    got = ran_out(rows, NOW_US, 1)
    assert got["message_id"].to_pylist() == ["a2", "a3"]  # a0 came before a1: it stays leased
    assert got["delivery_attempt"].to_pylist() == [1, 2]
    assert ran_out(rows, NOW_US - 2, 1).num_rows == 0  # a1's lease had not run out yet
    # a nacked row (at or below the mark) or one never delivered is no run-out head: a nack
    # cascades when it is written, and a row never leased has nothing after it leased
    for head in [("a1", 1, "a", 1, 0), ("a1", 1, "a", 1, 1), ("a1", 1, "a", 1, -NOW_US), ("a1", 1, "a", 0, past)]:
        assert ran_out(leased(head, ("a2", 1, "a", 1, later)), NOW_US, 1).num_rows == 0, head
    # a lease ending exactly now has run out; nothing of a key without a running lease is ended
    assert ran_out(leased(("a1", 1, "a", 1, NOW_US), ("a2", 1, "a", 1, NOW_US + 1)), NOW_US, 1)["message_id"].to_pylist() == ["a2"]
    assert ran_out(leased(("a1", 1, "a", 1, past), ("a2", 1, "a", 1, past)), NOW_US, 1).num_rows == 0
    assert ran_out(leased(), NOW_US, 1).num_rows == 0


def test_select_ends_the_state_s_ended_leases_in_the_same_source() -> None:
    ended = pa.table({"message_id": pa.array(["a2"], pa.string()), "delivery_attempt": pa.array([3], pa.int32())})
    state = KeyState(pa.array(["a"], pa.string()), True, ended)
    chosen = select("s", avail(("b1", 1, "b")), fresh(), 10, EXPIRES, hooks_for_ordering(), state)
    source = pa.concat_tables(chosen.parts)
    assert sorted(zip(source["op"].to_pylist(), source["message_id"].to_pylist())) == [("cascade", "a2"), ("lease", "b1")]
    cascade = source.filter(pc.equal(source["op"], "cascade"))
    assert cascade["delivery_attempt"].to_pylist() == [3]  # on the attempt it was decided on
    assert cascade["lease_expires"].cast(pa.int64()).to_pylist() == [CASCADED_US]
    assert [lease.message_id for lease in chosen.leases] == ["b1"]
