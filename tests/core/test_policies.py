"""Each built-in policy behaves as its name says, in both protocols and schedules."""

from __future__ import annotations

import itertools

import pytest

from dphil.core.episode import play
from dphil.core.policies import POLICIES, get_policy
from dphil.core.protocols import protocol_actions
from dphil.core.records import EpisodeConfig

PROTOCOLS = ("paper", "dpbench")
SCHEDULES = ("simultaneous", "sequential")


def episodes(
    policy: str, protocol: str, schedule: str = "simultaneous", n: int = 5, rounds: int = 5, seeds=range(20), **kw
):
    return [
        play(
            EpisodeConfig(
                model=f"scripted:{policy}", n=n, rounds=rounds, seed=s, protocol=protocol, schedule=schedule, **kw
            ),
            get_policy(policy),
        )
        for s in seeds
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_naive_deadlocks_in_round_one_when_all_start_together(protocol):
    for ep in episodes("naive", protocol):
        assert ep["deadlock"] and ep["deadlock_round"] == 1
        assert {t["action"] for t in ep["turns"]} == {protocol_actions(protocol)[0]}


@pytest.mark.parametrize(
    ("protocol", "schedule", "conflict", "n"),
    list(itertools.product(PROTOCOLS, SCHEDULES, ("random", "lowest-id"), (2, 3, 5, 10))),
)
def test_hierarchy_never_deadlocks_and_eats(protocol, schedule, conflict, n):
    eps = episodes("hierarchy", protocol, schedule, n=n, rounds=12, conflict=conflict, deadlock_mode="continue")
    assert not any(ep["deadlock"] for ep in eps)
    assert all(sum(ep["meals"]) > 0 for ep in eps)


@pytest.mark.parametrize(("protocol", "schedule"), list(itertools.product(PROTOCOLS, SCHEDULES)))
def test_idle_emits_no_action(protocol, schedule):
    for ep in episodes("idle", protocol, schedule, seeds=range(3)):
        assert all(t["action"] is None and t["reason"] == "no-action" for t in ep["turns"])
        assert len(ep["turns"]) == 25 and not ep["deadlock"]


@pytest.mark.parametrize(("protocol", "schedule"), list(itertools.product(PROTOCOLS, SCHEDULES)))
def test_thinker_only_thinks(protocol, schedule):
    expected = "think" if protocol == "paper" else "wait"
    for ep in episodes("thinker", protocol, schedule, seeds=range(3)):
        assert {t["action"] for t in ep["turns"]} == {expected}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_greedy_never_lets_go_and_some_eat(protocol):
    eps = episodes("greedy", protocol, rounds=8, seeds=range(40))
    for ep in eps:
        assert not any(t["action"] in ("put-down-left", "put-down-right", "release") for t in ep["turns"])
    eaters = [ep for ep in eps if sum(ep["meals"]) > 0]
    assert eaters, "greedy never ate in 40 episodes"
    # whoever eats keeps eating: meals concentrate on few philosophers
    assert any(ep["meals"].count(0) >= 3 for ep in eaters)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_random_uses_every_action_and_is_seeded(protocol):
    eps = episodes("random", protocol, rounds=10, seeds=range(10), deadlock_mode="continue")
    seen = {t["action"] for ep in eps for t in ep["turns"]}
    assert seen == set(protocol_actions(protocol))
    again = episodes("random", protocol, rounds=10, seeds=range(10), deadlock_mode="continue")
    assert eps == again
    other = episodes("random", protocol, rounds=10, seeds=range(10, 20), deadlock_mode="continue")
    assert [e["turns"] for e in eps] != [e["turns"] for e in other]


def test_unknown_policy_lists_the_known_ones():
    with pytest.raises(KeyError, match="hierarchy"):
        get_policy("smart")
    assert set(POLICIES) == {"random", "naive", "hierarchy", "idle", "thinker", "greedy"}
