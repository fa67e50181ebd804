"""policy.round_outcomes: one outcome per message in a group-commit round, and the lease split."""

from deltabus.policy.round_outcomes import Outcome, resolve, result_of, split


def test_ack_wins_over_deadline_changes_and_nacks_in_any_order():
    won = resolve([Outcome("m", 1, 30.0), Outcome("m", 1, None), Outcome("m", 1, 0.0)])
    assert won == {"m": Outcome("m", 1, None)}


def test_last_deadline_change_wins_without_an_ack():
    assert resolve([Outcome("m", 2, 10.0), Outcome("m", 2, 0.0)])["m"] == Outcome("m", 2, 0.0)
    assert resolve([Outcome("m", 2, 0.0), Outcome("m", 2, 60.0)])["m"] == Outcome("m", 2, 60.0)


def test_only_the_latest_delivery_counts():
    # an ack of delivery 1 cannot apply once delivery 2 holds the message: delivery 2's extension is kept
    won = resolve([Outcome("m", 1, None), Outcome("m", 2, 30.0)])
    assert won == {"m": Outcome("m", 2, 30.0)}
    assert resolve([Outcome("m", 3, 5.0), Outcome("m", 2, None)]) == {"m": Outcome("m", 3, 5.0)}


def test_messages_are_independent_and_kept_in_first_seen_order():
    won = resolve([Outcome("b", 1, None), Outcome("a", 1, 10.0), Outcome("b", 1, 10.0)])
    assert list(won) == ["b", "a"]
    assert won["b"].seconds is None and won["a"].seconds == 10.0
    assert resolve([]) == {}


def test_result_follows_the_winner_of_the_same_delivery():
    winner = Outcome("m", 2, None)
    assert result_of(Outcome("m", 2, 30.0), winner, True)  # lost to an ack that applied
    assert not result_of(Outcome("m", 2, 30.0), winner, False)
    assert not result_of(Outcome("m", 1, None), winner, True)  # superseded delivery
    assert not result_of(Outcome("m", 1, None), None, True)


def test_split_fills_callers_in_arrival_order():
    assert split(["", "", "", ""], [1, 2, 5]) == [[0], [1, 2], [3]]
    assert split([], [3]) == [[]]
    assert split(["", ""], []) == []
    assert split(["", ""], [0, 2]) == [[], [0, 1]]


def test_split_keeps_an_ordering_key_on_one_caller():
    # k1's three messages all go to the caller that got k1's first one, even past its ask
    got = split(["k1", "k2", "k1", "k1", ""], [2, 3])
    assert got == [[0, 1, 2, 3], [4]]
    owner = {k: c for c, idx in enumerate(got) for i in idx for k in [["k1", "k2", "k1", "k1", ""][i]] if k}
    for c, idx in enumerate(got):
        for i in idx:
            key = ["k1", "k2", "k1", "k1", ""][i]
            assert not key or owner[key] == c
    # order inside a caller is lease order
    assert all(idx == sorted(idx) for idx in got)


def test_of_one_attempt_the_lower_version_wins_and_versionless_ids_lose():
    """A seek gives the rows it brings back a lower version, and their attempts restart: an
    old id of the same attempt (a higher version, or none: the older format) loses."""
    for order in ([Outcome("m1", 1, None, 7), Outcome("m1", 1, None, -5)], [Outcome("m1", 1, None, -5), Outcome("m1", 1, None, 7)]):
        assert resolve(order)["m1"].message_version == -5
    assert resolve([Outcome("m1", 1, None, None), Outcome("m1", 1, 30.0, 4)])["m1"].message_version == 4
    assert resolve([Outcome("m1", 2, None, None), Outcome("m1", 1, None, -9)])["m1"].delivery_attempt == 2  # attempt first
    winner = resolve([Outcome("m1", 1, None, -5)])["m1"]
    assert result_of(Outcome("m1", 1, None, -5), winner, True) and not result_of(Outcome("m1", 1, None, 7), winner, True)
    assert result_of(Outcome("m1", 1, None, None), winner, True)  # an id of the older format names any version
