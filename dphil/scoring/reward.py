"""The episode reward of the published study, its shaped variant, and outcome metrics.

    total = alpha*no_deadlock + beta*throughput - gamma*fairness - delta*idle

`paper` is the four-term reward exactly as published, degenerate maximum
included: a table where nobody acts scores exactly 1.0. `shaped` pays the
no-deadlock bonus only when at least `min_meals` meals were eaten and counts
null actions as idle, so doing nothing scores -delta.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dphil.core.episode import action_counts

VARIANTS = ("paper", "shaped")


@dataclass(frozen=True)
class Term:
    """One term of the reward: its component name in records, its weight, and the weight's sign.

    `TERMS` is the one home of the reward's terms: scoring sums them, the advantages
    split each into per-seat shares (`dphil.train.advantages.SEAT_SHARES`), the timeline
    prints them and the scored-episode schema lists them; tests hold all of these to it.
    """

    name: str  # the key in `reward.components`
    weight: str  # the RewardSpec field (and `reward.weights` key) holding its weight
    sign: int  # +1 paid, -1 charged
    default: float  # the study's weight
    meaning: str


TERMS: tuple[Term, ...] = (
    Term("no_deadlock", "alpha", +1, 1.0, "1 if the table never deadlocked (shaped: and min_meals were eaten)"),
    Term("throughput", "beta", +1, 0.5, "meals / (N x rounds)"),
    Term("fairness", "gamma", -1, 0.3, "population variance of the meals per philosopher"),
    Term("idle", "delta", -1, 0.1, "idle share of the turns (shaped: null actions count as idle)"),
)


@dataclass(frozen=True)
class RewardSpec:
    """A reward variant and its weights (one per `TERMS` entry); recorded with every score."""

    variant: str = "paper"
    alpha: float = TERMS[0].default
    beta: float = TERMS[1].default
    gamma: float = TERMS[2].default
    delta: float = TERMS[3].default
    min_meals: int = 1

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown reward variant {self.variant!r} (expected paper or shaped)")
        for name in (t.weight for t in TERMS):
            value = getattr(self, name)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"weight {name} must be a finite number")
        if self.min_meals < 0:
            raise ValueError("min_meals must be >= 0")

    @property
    def weights(self) -> dict[str, float]:
        return {t.weight: getattr(self, t.weight) for t in TERMS}


def score(
    spec: RewardSpec,
    *,
    protocol: str,
    n: int,
    rounds: int,
    meals: Sequence[int],
    deadlock: bool,
    deadlock_round: int | None,
    rounds_played: int,
    turns: list[dict] | None = None,
    counts: tuple[int, int, int] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the `reward` and `metrics` objects for one episode outcome.

    The idle term needs only `action_counts(turns, protocol)`; pass `counts` when
    they are already known (replay computes them) instead of `turns`.
    """
    total_meals = sum(meals)
    null_turns, idle_turns, all_turns = counts if counts is not None else action_counts(turns or [], protocol)
    if spec.variant == "paper":
        no_deadlock = 0.0 if deadlock else 1.0
        acted = all_turns - null_turns
        idle = idle_turns / acted if acted else 0.0
    else:
        no_deadlock = 1.0 if (not deadlock and total_meals >= spec.min_meals) else 0.0
        idle = (idle_turns + null_turns) / all_turns if all_turns else 0.0
    throughput = total_meals / (n * rounds)
    fairness, gini, starvation = meal_stats(tuple(meals))
    components = {"no_deadlock": no_deadlock, "throughput": throughput, "fairness": fairness, "idle": idle}
    weights = spec.weights
    total = 0.0
    for t in TERMS:
        total += t.sign * weights[t.weight] * components[t.name]
    reward = {"variant": spec.variant, "total": total, "components": components, "weights": weights}
    if spec.variant == "shaped":
        reward["min_meals"] = spec.min_meals
    metrics = {
        "throughput_per_round": total_meals / rounds_played if rounds_played else 0.0,
        "gini_fairness": gini,
        "starvation": starvation,
        "time_to_deadlock": deadlock_round,
    }
    return reward, metrics


@lru_cache(maxsize=8192)
def meal_stats(meals: tuple[int, ...]) -> tuple[float, float, int]:
    """(variance, gini_fairness, starvation) of a meal vector; few distinct vectors occur, so cached."""
    return variance(meals), gini_fairness(meals), meals.count(0)


def variance(meals: Sequence[int]) -> float:
    """Population variance (ddof 0) of integer meal counts, computed exactly in integers."""
    n = len(meals)
    total = sum(meals)
    return (n * sum(map(operator.mul, meals, meals)) - total * total) / (n * n)


def gini_fairness(meals: Sequence[int]) -> float:
    """1 - normalised Gini coefficient of meals: 1.0 is perfectly even (and all-zero tables).

    The Gini coefficient is normalised by its maximum for n people, (n-1)/n,
    so one philosopher eating everything gives 0.0 at any table size.
    """
    n = len(meals)
    total = sum(meals)
    if n < 2 or total == 0:
        return 1.0
    ordered = sorted(meals)
    # G = sum_i (2i - n - 1) x_i / (n * total), i = 1..n over sorted values.
    g = sum((2 * k - n + 1) * x for k, x in enumerate(ordered)) / (n * total)
    return 1.0 - g * n / (n - 1)
