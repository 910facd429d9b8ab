"""The published reward, its shaped variant and the metrics, against hand-computed values."""

from __future__ import annotations

import pytest

from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.scoring.reward import RewardSpec, gini_fairness, score, variance
from dphil.scoring.score import score_record


def scored(policy: str, spec: RewardSpec, **kw) -> dict:
    cfg = EpisodeConfig(model=f"scripted:{policy}", n=kw.pop("n", 5), **kw)
    return score_record(play(cfg, get_policy(policy)), spec)


@pytest.mark.parametrize("protocol", ["paper", "dpbench"])
def test_nobody_acting_scores_exactly_one_under_paper(protocol):
    r = scored("idle", RewardSpec(), protocol=protocol)["reward"]
    assert r["total"] == 1.0
    assert r["components"] == {"no_deadlock": 1.0, "throughput": 0.0, "fairness": 0.0, "idle": 0.0}


@pytest.mark.parametrize("protocol", ["paper", "dpbench"])
def test_shaped_reward_removes_the_degenerate_maximum(protocol):
    r = scored("idle", RewardSpec(variant="shaped"), protocol=protocol)["reward"]
    assert r["total"] == pytest.approx(-0.1)
    assert r["components"]["no_deadlock"] == 0.0 and r["components"]["idle"] == 1.0
    thinker = scored("thinker", RewardSpec(variant="shaped"), protocol=protocol)["reward"]
    assert thinker["total"] == pytest.approx(-0.1)


def test_hand_computed_paper_reward():
    turns = (
        [{"action": "eat"}] * 3 + [{"action": "think"}] * 4 + [{"action": None}] * 2 + [{"action": "pick-up-left"}] * 6
    )
    reward, metrics = score(
        RewardSpec(),
        protocol="paper",
        n=3,
        rounds=5,
        meals=[2, 1, 0],
        deadlock=False,
        deadlock_round=None,
        rounds_played=5,
        turns=turns,
    )
    c = reward["components"]
    assert c["no_deadlock"] == 1.0
    assert c["throughput"] == pytest.approx(3 / 15)
    assert c["fairness"] == pytest.approx(2 / 3)  # population variance of 2,1,0
    assert c["idle"] == pytest.approx(4 / 13)  # think / non-null turns
    assert reward["total"] == pytest.approx(1.0 + 0.5 * 0.2 - 0.3 * (2 / 3) - 0.1 * (4 / 13))
    assert metrics == {
        "throughput_per_round": pytest.approx(0.6),
        "gini_fairness": pytest.approx(1 / 3),
        "starvation": 1,
        "time_to_deadlock": None,
    }


def test_hand_computed_shaped_reward_and_weights():
    turns = [{"action": "think"}] * 2 + [{"action": None}] * 2 + [{"action": "eat"}] * 6
    spec = RewardSpec(variant="shaped", alpha=2.0, beta=1.0, gamma=0.0, delta=1.0, min_meals=4)
    reward, _ = score(
        spec,
        protocol="paper",
        n=2,
        rounds=5,
        meals=[2, 1],
        deadlock=False,
        deadlock_round=None,
        rounds_played=5,
        turns=turns,
    )
    assert reward["components"]["no_deadlock"] == 0.0  # 3 meals < min_meals 4
    assert reward["components"]["idle"] == pytest.approx(4 / 10)
    assert reward["total"] == pytest.approx(0 + 1.0 * 0.3 - 0 - 0.4)
    assert reward["weights"] == {"alpha": 2.0, "beta": 1.0, "gamma": 0.0, "delta": 1.0}
    assert reward["variant"] == "shaped" and reward["min_meals"] == 4


def test_deadlock_zeroes_the_bonus_and_sets_time_to_deadlock():
    s = scored("naive", RewardSpec())
    assert s["reward"]["components"]["no_deadlock"] == 0.0
    assert s["metrics"]["time_to_deadlock"] == 1
    assert s["metrics"]["throughput_per_round"] == 0.0


def test_wait_is_idle_in_dpbench():
    turns = [{"action": "wait"}] * 3 + [{"action": "grab-left"}]
    reward, _ = score(
        RewardSpec(),
        protocol="dpbench",
        n=2,
        rounds=2,
        meals=[0, 0],
        deadlock=False,
        deadlock_round=None,
        rounds_played=2,
        turns=turns,
    )
    assert reward["components"]["idle"] == 0.75


def test_gini_fairness():
    assert gini_fairness([0, 0, 0]) == 1.0
    assert gini_fairness([3, 3, 3]) == 1.0
    assert gini_fairness([6, 0, 0]) == pytest.approx(0.0)
    assert gini_fairness([1, 0]) == pytest.approx(0.0)
    assert gini_fairness([2, 1, 0]) == pytest.approx(1 - (4 / 9) * 1.5)  # G = 8 / 18


def test_variance_is_population_variance():
    assert variance([1, 2, 3, 4]) == pytest.approx(1.25)
    assert variance([5]) == 0.0


def test_bad_weights_and_variants_are_refused():
    with pytest.raises(ValueError):
        RewardSpec(variant="greedy")
    with pytest.raises(ValueError):
        RewardSpec(alpha=float("nan"))
