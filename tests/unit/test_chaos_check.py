"""The chaos suite's invariant checks (bench/chaos_check.py): each must flag what it guards."""

import pytest

from bench.chaos import KillSettings, kill_shares, parse_args
from bench.chaos_check import Ack, Receipt, check_pulls, check_pushes


def rec(m, t0, st, clean=True, t1=None, sub="s"):
    return {"sub": sub, "m": m, "t0": t0, "t1": t0 + 0.01 if t1 is None else t1, "st": st, "clean": clean}


def test_a_message_never_acked_is_lost():
    r = check_pushes(["a", "b"], [rec("a", 1, 204), rec("b", 1, 500), rec("b", 2, 503)], kills=[])
    assert (r["acked"], r["lost"], r["duplicates"]) == (1, 1, 0)


def test_a_redelivery_after_a_clean_ack_without_a_kill_is_a_violation():
    r = check_pushes(["a"], [rec("a", 1, 204), rec("a", 5, 204)], kills=[])
    assert r["acked_then_redelivered"] == 1 and r["duplicates"] == 1
    assert r["duplicates_per_kill"] == {"-1": 1}


def test_a_kill_between_the_ack_and_the_redelivery_excuses_it_and_is_blamed():
    r = check_pushes(["a"], [rec("a", 1, 204), rec("a", 5, 204)], kills=[3.0])
    assert r["acked_then_redelivered"] == 0 and r["duplicates_per_kill"] == {"0": 1}


def test_a_kill_while_the_acked_push_was_in_flight_excuses_the_redelivery():
    # The answer came at 2.0, after the kill at 1.5: the driver was gone, the ack never recorded.
    r = check_pushes(["a"], [rec("a", 1, 204, t1=2.0), rec("a", 9, 204)], kills=[1.5])
    assert r["acked_then_redelivered"] == 0
    # A push that reached the endpoint just after the kill was sent before it: excused too.
    assert check_pushes(["a"], [rec("a", 1, 204, t1=2.0), rec("a", 9, 204)], kills=[0.9])["acked_then_redelivered"] == 0
    early = check_pushes(["a"], [rec("a", 1, 204, t1=2.0), rec("a", 9, 204)], kills=[0.2])  # long before it was sent: not
    assert early["acked_then_redelivered"] == 1


def test_an_ambiguous_2xx_counts_as_acked_but_never_against_a_redelivery():
    r = check_pushes(["a"], [rec("a", 1, 200, clean=False, t1=20), rec("a", 25, 204)], kills=[])
    assert (r["lost"], r["acked_then_redelivered"], r["duplicates"]) == (0, 0, 1)


def test_nacks_before_the_ack_are_not_duplicates_and_102_is_an_ack():
    r = check_pushes(["a", "b"], [rec("a", 1, 500), rec("a", 2, 429), rec("a", 3, 204), rec("b", 1, 102)], kills=[])
    assert (r["lost"], r["duplicates"], r["acked_then_redelivered"]) == (0, 0, 0)


def test_a_second_grant_inside_the_first_lease_is_granted_twice():
    first = Receipt("A", "m", called=10.0, received=10.2, deadline=10.0)
    second = Receipt("B", "m", called=12.0, received=19.0, deadline=10.0)  # before 10 + 10
    r = check_pulls(["m"], [first, second], [Ack("B", "m", 19.5)])
    assert (r["granted_twice"], r["lost"], r["duplicates"]) == (1, 0, 1)


def test_a_grant_after_the_lease_could_end_or_after_an_ack_in_between_is_fine():
    first = Receipt("A", "m", called=10.0, received=10.2, deadline=10.0)
    late = Receipt("B", "m", called=19.0, received=20.5, deadline=10.0)
    assert check_pulls(["m"], [first, late], [Ack("B", "m", 21)])["granted_twice"] == 0


def test_a_receipt_whose_pull_began_after_a_confirmed_ack_is_acked_then_redelivered():
    first = Receipt("A", "m", called=10.0, received=10.2, deadline=10.0)
    again = Receipt("B", "m", called=30.0, received=30.1, deadline=10.0)
    r = check_pulls(["m"], [first, again], [Ack("A", "m", 11.0)])
    assert r["acked_then_redelivered"] == 1 and r["granted_twice"] == 0


def test_published_but_never_acked_is_lost_and_unknown_ids_are_counted():
    r = check_pulls(["m", "n"], [Receipt("A", "x", 1, 2, 10)], [Ack("A", "m", 3)])
    assert (r["lost"], r["unknown_ids"]) == (1, 1)


def test_kill_shares_give_the_failing_endpoints_their_count_and_the_healthy_one_the_rest():
    shares = kill_shares(KillSettings(messages=1_000_000, kills=20))
    assert sum(shares.values()) == 1_000_000 and shares["ok"] == 1_000_000 - 6 * 2_000
    assert {k: v for k, v in shares.items() if k != "ok"} == dict.fromkeys(["flaky", "held", "drip", "huge", "refuse", "tls"], 2_000)
    small = kill_shares(KillSettings(messages=70, kills=1))  # fewer than 2,000 each: an even split
    assert set(small.values()) == {10} and sum(small.values()) == 70


@pytest.mark.parametrize("argv, named", [(["--only", "kills,nosuch"], "--only"), (["--messages", "0"], "--messages"),
                                          (["--kills", "-1"], "--kills")])
def test_a_bad_chaos_option_is_one_line_naming_it_and_exit_2(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2 and named in capsys.readouterr().err.splitlines()[-1]
