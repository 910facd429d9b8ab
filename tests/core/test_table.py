"""The table's rules, one behaviour at a time."""

from __future__ import annotations

import pytest

from dphil.core.conflicts import lowest_id, random_resolver
from dphil.core.protocols import (
    ALREADY_HELD,
    HELD_BY_NEIGHBOUR,
    LOST_CONFLICT,
    NEEDS_BOTH_FORKS,
    NO_ACTION,
    NOT_HOLDING,
    protocol_actions,
)
from dphil.core.table import FREE, Table


def turn_of(table: Table, r: int, i: int) -> dict:
    return next(t for t in table.turns if t["round"] == r and t["philosopher"] == i)


def test_forks_left_is_i_right_is_i_plus_1():
    t = Table(5, 3)
    t.play_simultaneous(["pick-up-right", "think", "think", "think", "pick-up-left"])
    assert t.holder == [FREE, 0, FREE, FREE, 4]


def test_protocol_action_sets():
    assert protocol_actions("paper") == (
        "pick-up-left",
        "pick-up-right",
        "put-down-left",
        "put-down-right",
        "eat",
        "think",
    )
    assert protocol_actions("dpbench") == ("grab-left", "grab-right", "release", "wait")


def test_every_failure_reason():
    t = Table(3, 5, protocol="paper")
    t.play_simultaneous(["pick-up-left", "think", "put-down-left"])  # 2 holds nothing
    assert turn_of(t, 1, 2)["reason"] == NOT_HOLDING
    t.play_simultaneous(["pick-up-left", "pick-up-right", "eat"])
    assert turn_of(t, 2, 0)["reason"] == ALREADY_HELD
    assert turn_of(t, 2, 1)["reason"] is None and turn_of(t, 2, 1)["ok"]  # fork 2 was free
    assert turn_of(t, 2, 2)["reason"] == NEEDS_BOTH_FORKS
    t.play_simultaneous([None, "think", "pick-up-left"])
    assert turn_of(t, 3, 2)["reason"] == HELD_BY_NEIGHBOUR  # fork 2 is philosopher 1's right
    assert turn_of(t, 3, 0) == {"round": 3, "philosopher": 0, "action": None, "ok": False, "reason": NO_ACTION}


def test_null_action_is_never_think():
    t = Table(2, 1)
    t.play_simultaneous([None, "think"])
    null = next(x for x in t.turns if x["action"] is None)
    assert null["ok"] is False and null["reason"] == NO_ACTION


def test_eat_needs_both_forks_and_keeps_them():
    t = Table(3, 6)
    t.play_simultaneous(["pick-up-left", "think", "think"])
    t.play_simultaneous(["pick-up-right", "think", "think"])
    t.play_simultaneous(["eat", "think", "think"])
    t.play_simultaneous(["eat", "think", "think"])
    assert t.meals == [2, 0, 0]
    assert t.holder[0] == 0 and t.holder[1] == 0


def test_lowest_id_wins_and_zero_beats_last_for_fork_zero():
    t = Table(5, 2, resolve=lowest_id)
    t.play_simultaneous(["pick-up-left", "think", "think", "think", "pick-up-right"])
    assert t.holder[0] == 0
    assert turn_of(t, 1, 4)["reason"] == LOST_CONFLICT


def test_random_conflicts_are_seeded_and_both_sides_win_sometimes():
    winners = set()
    for seed in range(40):
        t = Table(2, 1, resolve=random_resolver(seed))
        t.play_simultaneous(["pick-up-left", "pick-up-right"])  # both want fork 0
        winners.add(t.holder[0])
        again = Table(2, 1, resolve=random_resolver(seed))
        again.play_simultaneous(["pick-up-left", "pick-up-right"])
        assert again.holder == t.holder
    assert winners == {0, 1}


def test_releases_apply_before_pickups_in_the_same_round():
    t = Table(3, 5)
    t.play_simultaneous(["pick-up-right", "think", "think"])  # 0 holds fork 1
    t.play_simultaneous(["put-down-right", "pick-up-left", "think"])  # 1 takes fork 1 as it is freed
    assert t.holder[1] == 1
    assert t.turns[-3]["philosopher"] == 0 and t.turns[-3]["action"] == "put-down-right"
    assert turn_of(t, 2, 1)["ok"] is True


def test_simultaneous_deadlock_is_terminal_by_default():
    t = Table(4, 5)
    t.play_simultaneous(["pick-up-left"] * 4)
    assert t.deadlock_rounds == [1] and t.over and t.rounds_played == 1


def test_sequential_schedule_records_deadlock():
    t = Table(3, 5)
    for i in range(3):
        t.act(i, "pick-up-right")
    assert t.end_round() is True
    assert t.deadlock_rounds == [1] and t.over


def test_sequential_sees_the_previous_philosopher():
    t = Table(3, 5)
    t.act(0, "pick-up-right")  # takes fork 1
    t.act(1, "pick-up-left")  # fork 1 is gone already
    assert t.turns[-1]["reason"] == HELD_BY_NEIGHBOUR


def test_paper_continue_keeps_forks_and_records_each_deadlock():
    t = Table(3, 3, deadlock_mode="continue")
    t.play_simultaneous(["pick-up-left"] * 3)
    t.play_simultaneous(["think"] * 3)
    t.play_simultaneous(["put-down-left", "think", "think"])
    assert t.deadlock_rounds == [1, 2]
    assert not t.events and t.rounds_played == 3


def test_dpbench_continue_force_releases():
    t = Table(3, 3, protocol="dpbench", deadlock_mode="continue")
    t.play_simultaneous(["grab-left"] * 3)
    assert t.deadlock_rounds == [1]
    assert t.holder == [FREE] * 3
    assert t.events == [{"round": 1, "philosopher": None, "event": "force-release"}]


def test_dpbench_auto_eat_then_auto_release_next_round():
    t = Table(3, 4, protocol="dpbench")
    t.play_simultaneous(["grab-left", "wait", "wait"])
    t.play_simultaneous(["grab-right", "wait", "wait"])
    assert t.meals == [1, 0, 0] and t.eating[0]
    t.play_simultaneous(["wait", "wait", "wait"])  # eating round; released at its end
    assert t.holder == [FREE] * 3 and t.meals == [1, 0, 0]
    kinds = [(e["round"], e["event"]) for e in t.events]
    assert kinds == [(2, "auto-eat"), (3, "auto-release")]


def test_dpbench_release_by_eater_does_not_wipe_neighbours_new_fork():
    # DPBench's own code lets an eating philosopher's release erase a fork its
    # neighbour grabbed in the same round; here releases happen first.
    t = Table(3, 4, protocol="dpbench")
    t.play_simultaneous(["grab-left", "wait", "wait"])
    t.play_simultaneous(["grab-right", "wait", "wait"])  # 0 eats, holds forks 0 and 1
    t.play_simultaneous(["release", "grab-left", "wait"])  # 1 grabs fork 1 as 0 lets go
    assert t.holder[1] == 1
    assert t.holder[0] == FREE


def test_rounds_limit_the_episode():
    t = Table(2, 2)
    t.play_simultaneous(["think", "think"])
    assert not t.over
    t.play_simultaneous(["think", "think"])
    assert t.over and t.rounds_played == 2


def test_unknown_action_is_rejected():
    t = Table(2, 1)
    with pytest.raises(ValueError, match="not a paper action"):
        t.play_simultaneous(["grab-left", "think"])
