"""Credit assignment (dphil.train.advantages): hand-computed groups and properties.

Episodes are played through the real table and scored by the real scorer;
the expected numbers below were worked out by hand from the formulas in the
module's docstrings (shaped reward, alpha 1, beta 0.5, gamma 0.3, delta 0.1).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dphil.core.episode import new_table
from dphil.core.protocols import protocol_actions
from dphil.core.records import EpisodeConfig, episode_record
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record
from dphil.train.advantages import (
    MODES,
    AdvantageSpec,
    agent_turn_keys,
    philosopher_returns,
    state_keys,
    turn_advantages,
    turn_returns,
)


def play(
    rounds_actions,
    *,
    n=2,
    rounds=3,
    seed=1,
    protocol="paper",
    schedule="simultaneous",
    conflict="lowest-id",
    variant="shaped",
):
    """A scored episode record from the actions of each round (seat order)."""
    c = EpisodeConfig(
        model="test", n=n, rounds=rounds, seed=seed, protocol=protocol, schedule=schedule, conflict=conflict
    )
    t = new_table(c)
    for acts in rounds_actions:
        if t.over:
            break
        if schedule == "simultaneous":
            t.play_simultaneous(list(acts))
        else:
            for i, a in enumerate(acts):
                t.act(i, a)
            t.end_round()
    return score_record(episode_record(c, t), RewardSpec(variant=variant))


# Two philosophers, three rounds; philosopher 0's forks are 0 (left) and 1 (right), 1's are 1 and 0.
# e1: 0 picks up both forks and eats while 1 thinks: meals [1, 0], no deadlock.
# e2: both pick up their left fork in round 1: deadlock, both completed it.
# e3: 1 picks up its left fork, then 0 picks up its left fork in round 2 and completes the deadlock.
#
# The deadlock blame is shared by every holder in the cycle in proportion to its rounds of holding
# one fork and waiting for the other (dphil.train.blame). Before, it fell only on whoever completed
# the cycle: in e3 philosopher 0 took all of it (nd = [-1, 1]) though 1 had held its fork a round
# longer; the e3 numbers below changed with that rule (e1 and e2 did not).
def group():
    e1 = play([["pick-up-left", "think"], ["pick-up-right", "think"], ["eat", "think"]])
    e2 = play([["pick-up-left", "pick-up-left"]])
    e3 = play([["think", "pick-up-left"], ["pick-up-left", "think"]])
    return [e1, e2, e3]


def by_seat_round(record, values):
    return {(t["philosopher"], t["round"]): v for t, v in zip(record["turns"], values, strict=True)}


def test_hand_computed_rewards_and_philosopher_returns():
    e1, e2, e3 = group()
    # e1: 1 + 0.5*1/6 - 0.3*0.25 - 0.1*3/6
    assert e1["reward"]["total"] == pytest.approx(0.958333, abs=1e-6)
    # p0: 1 + 0.5*1/3 - 0.3*(1-0.5)^2 - 0;  p1: 1 + 0 - 0.3*(0-0.5)^2 - 0.1*(2*3/6)
    assert philosopher_returns(e1) == pytest.approx([1.091667, 0.825], abs=1e-6)
    # e2: both completed the deadlock, blame 1/2 each: nd_i = 1 - 2*(1/2) = 0
    assert e2["reward"]["total"] == 0.0
    assert philosopher_returns(e2) == [0.0, 0.0]
    # e3: 1 held and waited 2 rounds, 0 one round: blame [1/3, 2/3], nd_i = 1 - 2*b_i = [1/3, -1/3];
    # each thought once: idle share 0.1*2*1/4 = 0.05
    assert e3["reward"]["total"] == pytest.approx(-0.05, abs=1e-9)
    assert philosopher_returns(e3) == pytest.approx([1 / 3 - 0.05, -1 / 3 - 0.05], abs=1e-9)


def test_hand_computed_discounted_returns_and_state_keys():
    e1, _, e3 = group()
    # e1, gamma 0.5. p0 rewards per round [0, 0, 0.5/3 + 1 - 0.075]; p1 [-1/30, -1/30, 1 - 0.075 - 1/30]
    r1 = by_seat_round(e1, turn_returns(e1, 0.5))
    assert r1[(0, 1)] == pytest.approx(0.25 * 1.091667, abs=1e-6)
    assert r1[(1, 1)] == pytest.approx(-1 / 30 - 1 / 60 + 0.25 * 0.891667, abs=1e-6)
    assert r1[(0, 3)] == pytest.approx(1.091667, abs=1e-6)
    # e3: p0 [-0.05 (think), 1/3 (its blame share, in the deadlock round)]; p1 [0, -0.05 - 1/3]
    r3 = by_seat_round(e3, turn_returns(e3, 0.5))
    assert r3[(0, 1)] == pytest.approx(-0.05 + 0.5 / 3) and r3[(1, 1)] == pytest.approx(0.5 * (-0.05 - 1 / 3))
    k1 = by_seat_round(e1, state_keys(e1))
    # (seat, round, holds left, holds right, left free, right free, meals, eating)
    assert k1[(0, 1)] == (0, 1, False, False, True, True, 0, False)
    assert k1[(0, 2)] == (0, 2, True, False, False, True, 0, False)
    assert k1[(1, 2)] == (1, 2, False, False, True, False, 0, False)
    assert k1[(0, 3)] == (0, 3, True, True, False, False, 0, False)


def test_hand_computed_episode_advantages():
    adv = turn_advantages(group(), AdvantageSpec("episode"))
    # rewards [0.958333, 0, -0.05]: mean 0.302778, std 0.463998
    assert adv.episode == pytest.approx([1.412841, -0.652541, -0.760300], abs=1e-6)
    assert adv.turns[0] == pytest.approx([1.412841] * 6, abs=1e-6)
    assert (adv.groups, adv.tied, adv.episode_tied) == (1, 0, False)


def test_hand_computed_philosopher_advantages():
    eps = group()
    adv = turn_advantages(eps, AdvantageSpec("philosopher"))
    # seat 0 returns [1.091667, 0, 0.283333]:  mean 0.458333, std 0.462531
    # seat 1 returns [0.825, 0, -0.383333]:    mean 0.147222, std 0.504165
    seat0 = [1.369274, -0.990922, -0.378352]
    seat1 = [1.344355, -0.292012, -1.052344]
    for e, record in enumerate(eps):
        got = by_seat_round(record, adv.turns[e])
        for (i, _), a in got.items():
            assert a == pytest.approx((seat0, seat1)[i][e], abs=1e-6)
    # e3's philosopher 1 grabbed first and held longest: it is now credited below philosopher 0,
    # who completed the cycle (under the old rule, completer-only blame, it was the other way round)
    assert by_seat_round(eps[2], adv.turns[2])[(0, 2)] > by_seat_round(eps[2], adv.turns[2])[(1, 2)]
    assert (adv.groups, adv.tied) == (2, 0)


def test_hand_computed_step_advantages():
    eps = group()
    adv = turn_advantages(eps, AdvantageSpec("step", gamma=0.5, weight=1.0))
    # Only round 1 repeats a state across episodes (one step group per seat):
    # seat 0 returns [0.272917, 0, 0.116667]: mean 0.129861, std 0.111808 -> [1.279467, -1.161458, -0.118009]
    # seat 1 returns [0.172917, 0, -0.191667]: mean -0.00625, std 0.148906 -> [1.203211, 0.041972, -1.245183]
    episode = [1.412841, -0.652541, -0.760300]
    step0 = [1.279467, -1.161458, -0.118009]
    step1 = [1.203211, 0.041972, -1.245183]
    for e, record in enumerate(eps):
        got = by_seat_round(record, adv.turns[e])
        assert got[(0, 1)] == pytest.approx(episode[e] + step0[e], abs=1e-5)
        assert got[(1, 1)] == pytest.approx(episode[e] + step1[e], abs=1e-5)
        for (_, r), a in got.items():
            if r > 1:  # singleton step groups: the episode advantage alone
                assert a == pytest.approx(episode[e], abs=1e-6)
    assert (adv.groups, adv.tied, adv.singletons) == (2, 0, 6)
    half = turn_advantages(eps, AdvantageSpec("step", gamma=0.5, weight=0.5))
    assert by_seat_round(eps[0], half.turns[0])[(0, 1)] == pytest.approx(1.412841 + 0.5 * 1.279467, abs=1e-5)


def test_unscaled_advantages_are_differences_from_the_mean():
    adv = turn_advantages(group(), AdvantageSpec("episode"), scale=False)
    assert adv.episode == pytest.approx([0.655556, -0.302778, -0.352778], abs=1e-6)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_group_whose_returns_all_tie_gets_zero_advantages_and_is_counted(mode):
    same = [play([["pick-up-left", "pick-up-left"]]) for _ in range(3)]
    adv = turn_advantages(same, AdvantageSpec(mode))
    assert all(a == 0.0 for turns in adv.turns for a in turns)
    assert adv.tied == adv.groups >= 1 and adv.episode_tied


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "team"},
        {"mode": "step", "gamma": 1.5},
        {"mode": "step", "gamma": -0.1},
        {"mode": "step", "weight": -1.0},
        {"mode": "step", "weight": math.inf},
        {"mode": "step", "gamma": math.nan},
    ],
)
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValueError):
        AdvantageSpec(**bad)


def test_a_group_needs_episodes_of_one_table_size():
    with pytest.raises(ValueError, match="table size"):
        turn_advantages([play([["think", "think"]] * 3), play([["think"] * 3] * 3, n=3)], AdvantageSpec("philosopher"))


# -- properties --------------------------------------------------------------------------------


@st.composite
def groups(draw):
    """Several episodes of one scenario, from arbitrary actions (null ones included)."""
    protocol = draw(st.sampled_from(["paper", "dpbench"]))
    n = draw(st.integers(2, 4))
    rounds = draw(st.integers(1, 4))
    config = dict(
        n=n,
        rounds=rounds,
        seed=draw(st.integers(0, 99)),
        protocol=protocol,
        schedule=draw(st.sampled_from(["simultaneous", "sequential"])),
        conflict=draw(st.sampled_from(["random", "lowest-id"])),
        variant=draw(st.sampled_from(["paper", "shaped"])),
    )
    action = st.sampled_from([*protocol_actions(protocol), None])
    size = draw(st.integers(2, 5))
    episodes = []
    for _ in range(size):
        acts = draw(st.lists(st.lists(action, min_size=n, max_size=n), min_size=rounds, max_size=rounds))
        episodes.append(play(acts, **config))
    return episodes


@settings(max_examples=150, deadline=None)
@given(groups())
def test_philosopher_returns_average_to_the_episode_reward(eps):
    for e in eps:
        returns = philosopher_returns(e)
        assert sum(returns) / len(returns) == pytest.approx(e["reward"]["total"], abs=1e-9)
        # Undiscounted, the return from a philosopher's first turn is its whole return.
        for t, g in zip(e["turns"], turn_returns(e, 1.0), strict=True):
            if t["round"] == 1:
                assert g == pytest.approx(returns[t["philosopher"]], abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(groups(), st.sampled_from(list(MODES)), st.booleans())
def test_zero_sum_within_each_comparison_group(eps, mode, scale):
    spec = AdvantageSpec(mode, gamma=0.9, weight=0.7)
    adv = turn_advantages(eps, spec, scale=scale)
    assert sum(adv.episode) == pytest.approx(0.0, abs=1e-6)
    assert [len(t) for t in adv.turns] == [len(e["turns"]) for e in eps]
    if mode == "episode":
        assert all(a == adv.episode[k] for k, turns in enumerate(adv.turns) for a in turns)
    elif mode == "philosopher":
        per_seat: dict[int, list[float]] = {}
        for e, turns in zip(eps, adv.turns, strict=True):
            seen = {t["philosopher"]: a for t, a in zip(e["turns"], turns, strict=True)}
            for i, a in seen.items():
                per_seat.setdefault(i, []).append(a)
        for values in per_seat.values():
            assert sum(values) == pytest.approx(0.0, abs=1e-6)
    elif mode == "counterfactual":  # one comparison group: every turn of the group
        assert sum(a for turns in adv.turns for a in turns) == pytest.approx(0.0, abs=1e-6)
    else:
        per_key: dict[tuple, list[float]] = {}
        keys, weight = (state_keys, spec.weight) if mode == "step" else (agent_turn_keys, 1.0)
        for k, (e, turns) in enumerate(zip(eps, adv.turns, strict=True)):
            base = adv.episode[k] if mode == "step" else 0.0
            for key, a in zip(keys(e), turns, strict=True):
                per_key.setdefault(key, []).append((a - base) / weight)
        for values in per_key.values():
            assert sum(values) == pytest.approx(0.0, abs=1e-6)
            if len(values) == 1:
                assert values[0] == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(groups(), st.sampled_from(list(MODES)), st.randoms(use_true_random=False))
def test_reordering_the_episodes_reorders_the_advantages(eps, mode, rnd):
    order = list(range(len(eps)))
    rnd.shuffle(order)
    spec = AdvantageSpec(mode)
    a = turn_advantages(eps, spec)
    b = turn_advantages([eps[k] for k in order], spec)
    for pos, k in enumerate(order):
        assert b.turns[pos] == pytest.approx(a.turns[k], abs=1e-9)
    assert (a.groups, a.tied, a.singletons) == (b.groups, b.tied, b.singletons)


@settings(max_examples=60, deadline=None)
@given(groups(), st.sampled_from(list(MODES)))
def test_copies_of_one_episode_tie_everywhere(eps, mode):
    copies = [eps[0]] * len(eps)
    adv = turn_advantages(copies, AdvantageSpec(mode))
    if mode == "counterfactual":  # its comparison group is the turns, which differ: copies just agree
        assert all(turns == adv.turns[0] for turns in adv.turns)
        return
    assert all(a == 0.0 for turns in adv.turns for a in turns)
    assert adv.tied == adv.groups
