"""The credit modes that know who did what: agent-turn, counterfactual, and the deadlock blame.

Hand-computed on the three-episode group of tests/train/test_advantages.py (two
philosophers, three rounds, shaped reward: alpha 1, beta 0.5, gamma 0.3, delta 0.1),
then properties over arbitrary groups of every protocol, schedule and conflict rule.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphil.core.conflicts import coin
from dphil.io.errors import UsageError
from dphil.train.advantages import (
    MODES,
    AdvantageSpec,
    agent_turn_keys,
    keyed_advantages,
    modes_using,
    philosopher_returns,
    turn_advantages,
)
from dphil.train.blame import deadlock_blame, hold_wait_rounds
from dphil.train.counterfactual import counterfactual_differences
from dphil.train.replay import replay
from tests.train.test_advantages import by_seat_round, group, groups, play

# -- the deadlock blame ------------------------------------------------------------------------------


def test_hand_computed_hold_and_wait_runs():
    # e3 of the group: 1 takes fork 1 in round 1, 0 takes fork 0 in round 2 (deadlock).
    # End-of-round holders [fork 0, fork 1]: round 1 [-, 1], round 2 [0, 1].
    e3 = group()[2]
    r = replay(e3)
    assert (r.deadlock_round, r.holders_by_round) == (2, [[-1, 1], [0, 1]])
    assert hold_wait_rounds(r.holders_by_round, 2) == [1, 2]
    assert deadlock_blame(r.holders_by_round, 2) == pytest.approx([1 / 3, 2 / 3])
    # Three seats. Seat 1 holds both forks in round 1 (eating is not waiting), puts its right one
    # down in round 2, seat 2 takes its left fork in round 3, seat 0 in round 4: runs 1, 3, 2.
    holders = [[-1, 1, 1], [-1, 1, -1], [-1, 1, 2], [0, 1, 2]]
    assert hold_wait_rounds(holders, 4) == [1, 3, 2]
    assert deadlock_blame(holders, 4) == pytest.approx([1 / 6, 3 / 6, 2 / 6])
    # All right forks (seat i holds fork i+1): seat 2 held fork 0 since round 1, the others one round.
    assert hold_wait_rounds([[2, -1, -1], [2, 0, 1]], 2) == [1, 1, 2]


def test_the_blame_reaches_the_returns_of_a_played_episode():
    # Three seats, paper reward, failed `eat`s instead of thinking (no idle turns, no meals):
    # 1 takes fork 1, then fork 2 (both: eating-ready, not waiting), puts fork 2 down as 2 takes
    # it (releases come first), then 0 takes fork 0: deadlock in round 4.
    e = play(
        [
            ["eat", "pick-up-left", "eat"],
            ["eat", "pick-up-right", "eat"],
            ["eat", "put-down-right", "pick-up-left"],
            ["pick-up-left", "eat", "eat"],
        ],
        n=3,
        rounds=5,
        variant="paper",
    )
    r = replay(e)
    assert r.deadlock_round == 4
    assert r.holders_by_round == [[-1, 1, -1], [-1, 1, 1], [-1, 1, 2], [0, 1, 2]]
    # Runs: 0 one round, 1 rounds 3-4 (in round 2 it held both), 2 rounds 3-4: blame [1/5, 2/5, 2/5];
    # R_i = alpha * (1 - 3 * b_i), averaging to the episode reward 0.
    assert hold_wait_rounds(r.holders_by_round, 4) == [1, 2, 2]
    assert e["reward"]["total"] == 0.0
    assert philosopher_returns(e) == pytest.approx([0.4, -0.2, -0.2], abs=1e-9)


def test_dpbench_continue_keeps_the_deadlock_holders_before_the_forced_release():
    e = play([["grab-left", "grab-left"], ["wait", "wait"]], protocol="dpbench", rounds=2)
    assert e["deadlock_mode"] == "terminal"
    record = dict(e, deadlock_mode="continue")
    assert replay(record).holders_by_round[0] == [0, 1]
    assert replay(record).deadlock_round == 1


# -- agent-turn --------------------------------------------------------------------------------------


def test_hand_computed_agent_turn_advantages():
    eps = group()
    adv = turn_advantages(eps, AdvantageSpec("agent-turn", gamma=0.5))
    # Returns from each turn on (gamma 0.5), [episode] per (seat, its turn index):
    # (0, 0): [0.272917, 0, 0.116667] mean 0.129861 std 0.111808 -> [1.279467, -1.161458, -0.118009]
    # (1, 0): [0.172917, 0, -0.191667] mean -0.00625 std 0.148906 -> [1.203211, 0.041972, -1.245183]
    # (0, 1): e1 0.545833, e3 1/3 (e2 ended in round 1): two members -> [+1, -1] (x eps / (std + eps))
    # (1, 1): e1 0.4125, e3 -0.383333 -> [+1, -1]; (0, 2), (1, 2): only e1 lasted 3 rounds -> 0
    first0 = [1.279467, -1.161458, -0.118009]
    first1 = [1.203211, 0.041972, -1.245183]
    for e, record in enumerate(eps):
        got = by_seat_round(record, adv.turns[e])
        assert got[(0, 1)] == pytest.approx(first0[e], abs=1e-5)
        assert got[(1, 1)] == pytest.approx(first1[e], abs=1e-5)
    e1, e3 = by_seat_round(eps[0], adv.turns[0]), by_seat_round(eps[2], adv.turns[2])
    assert e1[(0, 2)] == pytest.approx(1.0, abs=1e-4) and e3[(0, 2)] == pytest.approx(-1.0, abs=1e-4)
    assert e1[(1, 2)] == pytest.approx(1.0, abs=1e-4) and e3[(1, 2)] == pytest.approx(-1.0, abs=1e-4)
    assert e1[(0, 3)] == e1[(1, 3)] == 0.0
    assert (adv.groups, adv.tied, adv.singletons) == (4, 0, 2)
    unscaled = turn_advantages(eps, AdvantageSpec("agent-turn", gamma=0.5), scale=False)
    # (0, 1) unscaled: 0.545833 - mean(0.545833, 0.333333) = 0.10625
    assert by_seat_round(eps[0], unscaled.turns[0])[(0, 2)] == pytest.approx(0.10625, abs=1e-6)


def test_agent_turn_keys_count_each_seats_turns():
    e1 = group()[0]
    keys = by_seat_round(e1, agent_turn_keys(e1))
    assert keys == {(i, r): (i, r - 1) for i in range(2) for r in range(1, 4)}


# -- counterfactual ----------------------------------------------------------------------------------


def test_hand_computed_counterfactual_differences():
    e1, e2, e3 = group()
    # u = 0.5 * table meals / (2 * 3) - 0.1 * idle turns / D - 1 * [deadlock]; shaped D = all turns.
    # e2 (D 2), round 1, both pick up left: u = -1 (deadlock). Seat 0's other actions, seat 1
    # still reaching left for fork 1: pick-up-right contests fork 1 and wins (lowest id): 0;
    # the two put-downs and eat fail: 0; think: -0.05. Baseline -0.01, difference -0.99; seat 1 alike.
    assert counterfactual_differences(e2) == pytest.approx([-0.99, -0.99])
    # e1 (D 6, idle costs 1/60): round 1 (0 picks left, 1 thinks): u = -1/60. Seat 0's others:
    # -1/60 each, think -2/60: baseline -0.02 -> 1/300. Seat 1's others: pick-up-left completes a
    # deadlock (-1), the rest 0: baseline -0.2 -> 0.183333. Round 2 (0 picks right): seat 0 as in
    # round 1 (1/300); seat 1's others all fail without idling: 0 -> -1/60. Round 3 (0 eats,
    # 1/12): seat 0's others lose the meal (-1/60, think -2/60) -> 0.086667; seat 1's keep it
    # without idling (1/12) -> -1/60.
    want1 = {(0, 1): 1 / 300, (1, 1): 0.55 / 3, (0, 2): 1 / 300, (1, 2): -1 / 60, (0, 3): 0.26 / 3, (1, 3): -1 / 60}
    assert by_seat_round(e1, counterfactual_differences(e1)) == pytest.approx(want1)
    # e3 (D 4, idle 0.025): round 1 (0 thinks, 1 picks left, u -0.025): seat 0's pick-up-left
    # deadlocks (-1), its others 0 -> -0.025 + 0.2 = 0.175; seat 1's others -0.025, think -0.05
    # -> 0.005. Round 2 (0 picks left: deadlock, u -1.025): seat 0's others -0.025, think -0.05 ->
    # -0.995; seat 1's put-down-left avoids it (0), the other four keep it (-1) -> -1.025 + 0.8.
    want3 = {(0, 1): 0.175, (1, 1): 0.005, (0, 2): -0.995, (1, 2): -0.225}
    assert by_seat_round(e3, counterfactual_differences(e3)) == pytest.approx(want3)


def test_hand_computed_counterfactual_advantages():
    eps = group()
    adv = turn_advantages(eps, AdvantageSpec("counterfactual"))
    # The 12 differences above: mean -0.231389, std 0.450066, one comparison group.
    want = [
        {(0, 1): 0.521528, (1, 1): 0.921468, (0, 2): 0.521528, (1, 2): 0.47709, (0, 3): 0.706685, (1, 3): 0.47709},
        {(0, 1): -1.685552, (1, 1): -1.685552},
        {(0, 1): 0.902952, (1, 1): 0.525231, (0, 2): -1.696662, (1, 2): 0.014195},
    ]
    for e, record in enumerate(eps):
        assert by_seat_round(record, adv.turns[e]) == pytest.approx(want[e], abs=1e-5)
    assert (adv.groups, adv.tied) == (1, 0)
    assert adv.episode == turn_advantages(eps, AdvantageSpec("episode")).episode


def test_a_record_its_conflict_rule_does_not_reproduce_is_refused_with_exit_64():
    # Both reach for fork 1 (0 right, 1 left) under the random rule: the seed's coin decides.
    e = play([["pick-up-right", "pick-up-left"]], conflict="random", seed=1, rounds=1)
    counterfactual_differences(e)  # the seed's own coin replays it
    flipped = next(s for s in range(100) if coin(s, 1, 1) != coin(1, 1, 1))
    with pytest.raises(UsageError) as err:
        counterfactual_differences(dict(e, seed=flipped))
    assert err.value.exit_code == 64 and "\n" not in err.value.message and "counterfactual" in err.value.message
    with pytest.raises(UsageError, match="contested fork"):
        counterfactual_differences(dict(e, seed=None))


# -- properties ------------------------------------------------------------------------------------


# Quarters: exact in binary, so a shift never makes two different values tie by rounding.
quarters = st.integers(-40, 40).map(lambda k: k / 4)
values = st.lists(st.lists(quarters, min_size=1, max_size=4), min_size=2, max_size=4)


@settings(max_examples=200, deadline=None)
@given(values, quarters, st.booleans(), st.integers(1, 3))
def test_keyed_advantages_are_mean_zero_shift_invariant_and_tie_to_zero(vals, shift, scale, n_keys):
    keys = [[k % n_keys for k in range(len(v))] for v in vals]
    adv, groups, tied, singletons = keyed_advantages(keys, vals, scale=scale)
    shifted, *counts = keyed_advantages(keys, [[x + shift for x in v] for v in vals], scale=scale)
    assert counts == [groups, tied, singletons]
    for a, b in zip(adv, shifted, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    members: dict[int, list[float]] = {}
    for ks, advs in zip(keys, adv, strict=True):
        for k, a in zip(ks, advs, strict=True):
            members.setdefault(k, []).append(a)
    for group_advs in members.values():
        assert sum(group_advs) == pytest.approx(0.0, abs=1e-6)
    assert groups + singletons == len(members) and 0 <= tied <= groups
    same, g, t, _ = keyed_advantages(keys, [[1.5] * len(v) for v in vals], scale=scale)
    assert all(a == 0.0 for row in same for a in row) and t == g


@settings(max_examples=120, deadline=None)
@given(groups())
def test_counterfactual_replays_every_protocol_schedule_and_conflict_rule_deterministically(eps):
    for e in eps:
        diffs = counterfactual_differences(e)
        assert len(diffs) == len(e["turns"])
        assert diffs == counterfactual_differences(e)
    adv = turn_advantages(eps, AdvantageSpec("counterfactual"))
    flat = [a for turns in adv.turns for a in turns]
    assert sum(flat) == pytest.approx(0.0, abs=1e-6)
    if adv.tied:
        assert all(a == 0.0 for a in flat)


@settings(max_examples=120, deadline=None)
@given(groups())
def test_the_blame_is_shared_by_every_holder_of_the_cycle(eps):
    for e in eps:
        r = replay(e)
        if r.deadlock_round is None:
            continue
        runs = hold_wait_rounds(r.holders_by_round, r.deadlock_round)
        assert all(h >= 1 for h in runs)  # everyone holds one fork and waits in a deadlock
        blame = deadlock_blame(r.holders_by_round, r.deadlock_round)
        assert sum(blame) == pytest.approx(1.0) and all(b > 0 for b in blame)


# -- the registry ------------------------------------------------------------------------------------


def test_each_mode_records_the_parameters_it_uses():
    assert modes_using("gamma") == ["step", "agent-turn"] and modes_using("weight") == ["step"]
    assert AdvantageSpec("agent-turn", gamma=0.9).as_record() == {
        "mode": "agent-turn",
        "gamma": 0.9,
        "blame": "hold-and-wait",
    }
    assert AdvantageSpec("counterfactual", gamma=0.9).as_record() == {"mode": "counterfactual"}
    assert AdvantageSpec("step").as_record() == {"mode": "step", "gamma": 0.95, "weight": 1.0, "blame": "hold-and-wait"}
    assert all(m.summary and callable(m.assign) for m in MODES.values())


def test_the_checkpoint_schema_knows_every_mode():
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "checkpoint.schema.json").read_text())
    assert schema["properties"]["advantage"]["properties"]["mode"]["enum"] == list(MODES)
