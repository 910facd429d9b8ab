"""Each philosopher's share of its episode's reward, round by round.

The `philosopher`, `step` and `agent-turn` credit modes compare what one seat earned,
not what the table earned; these pure functions split a scored episode's reward into
per-seat, per-round rewards whose mean over the seats, summed over the rounds, is the
episode reward exactly (each reward term's split is in `SEAT_SHARES`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dphil.core.protocols import IDLE_ACTIONS
from dphil.scoring.reward import TERMS
from dphil.train.blame import deadlock_blame
from dphil.train.replay import Replayed, replay


def philosopher_returns(record: dict[str, Any]) -> list[float]:
    """Philosopher i's share of its episode's reward; their mean over the table is the reward.

    With the record's weights (alpha, beta, gamma, delta), N philosophers, R
    configured rounds, M_i the meals of i and M the mean of M_i:

        R_i = alpha * nd_i + beta * M_i / R - gamma * (M_i - M)^2 - delta * idle_i

    * nd_i, the no-deadlock share: the episode's no-deadlock term when it did
      not deadlock (1, or 0 when the shaped reward's meal floor was missed).
      After a deadlock, 1 - N * b_i, where b_i is the seat's share of the blame
      (`dphil.train.blame.deadlock_blame`: every holder in the cycle, in
      proportion to how many rounds it held its fork and waited for the other).
      The shares average to 0, the episode's term.
    * idle_i = N * idle turns of i / the reward's denominator (turns with an
      action under `paper`, all turns under `shaped`, which also counts null
      actions as idle), so the shares average to the episode's idle term.
    """
    return [sum(rs) for rs in round_rewards(record)]


def turn_returns(record: dict[str, Any], gamma: float) -> list[float]:
    """The acting philosopher's discounted return from each turn on (aligned with `turns`).

    A philosopher's reward in round t is beta * (meals eaten in t) / R minus
    delta times its idle share of the turn; the no-deadlock share and the
    fairness term are paid in the last round played, except a deadlock's blame
    share, paid in the first deadlock round. Undiscounted (gamma = 1), the
    return from a philosopher's first turn is its `philosopher_returns`.
    """
    rewards = round_rewards(record)
    out = []
    for t in record["turns"]:
        rs = rewards[t["philosopher"]]
        start = t["round"] - 1
        g, ret = 1.0, 0.0
        for x in rs[start:]:
            ret += g * x
            g *= gamma
        out.append(ret)
    return out


def round_rewards(record: dict[str, Any]) -> list[list[float]]:
    """[philosopher][round - 1]: each philosopher's reward per round played (see turn_returns).

    The sum over the reward's terms (`dphil.scoring.reward.TERMS`) of each term's
    signed, weighted per-seat share (`SEAT_SHARES`).
    """
    reward = record["reward"]
    w = reward["weights"]
    seats = _Seats(record, replay(record))
    out = [[0.0] * seats.played for _ in range(seats.n)]
    if not seats.played:
        return out
    for term in TERMS:
        for i, row in enumerate(SEAT_SHARES[term.name](seats, w[term.weight])):
            for r, x in enumerate(row):
                out[i][r] += term.sign * x
    return out


@dataclass
class _Seats:
    """What the per-seat shares of one scored episode are computed from."""

    record: dict[str, Any]
    replay: Replayed

    @property
    def n(self) -> int:
        return self.record["n"]

    @property
    def played(self) -> int:
        return len(self.replay.meals_by_round)

    def zeros(self) -> list[list[float]]:
        return [[0.0] * self.played for _ in range(self.n)]

    def meals(self) -> list[int]:
        return [sum(col) for col in zip(*self.replay.meals_by_round, strict=True)]


def _no_deadlock_shares(s: _Seats, weight: float) -> list[list[float]]:
    """The episode's no-deadlock term (1, or 0 below the shaped meal floor) in the last round
    played; after a deadlock, 1 - N * b_i in the first deadlock round, b_i the seat's share of
    the blame (every holder in the cycle, by its rounds of holding and waiting)."""
    out, n = s.zeros(), s.n
    if s.replay.deadlock_round is None:
        shares = [s.record["reward"]["components"]["no_deadlock"]] * n
        pay_at = s.played - 1
    else:
        blame = deadlock_blame(s.replay.holders_by_round, s.replay.deadlock_round)
        shares = [1.0 - n * b for b in blame]
        pay_at = s.replay.deadlock_round - 1
    for i in range(n):
        out[i][pay_at] = weight * shares[i]
    return out


def _throughput_shares(s: _Seats, weight: float) -> list[list[float]]:
    """Meals eaten by the seat in each round over the configured rounds R."""
    out, rounds = s.zeros(), s.record["rounds"]
    for r, eaten in enumerate(s.replay.meals_by_round):
        for i in range(s.n):
            out[i][r] = weight * eaten[i] / rounds
    return out


def _fairness_shares(s: _Seats, weight: float) -> list[list[float]]:
    """(M_i - M)^2 in the last round played: the shares average to the meals' variance."""
    out, meals = s.zeros(), s.meals()
    mean_meals = sum(meals) / s.n
    for i in range(s.n):
        out[i][s.played - 1] = weight * (meals[i] - mean_meals) ** 2
    return out


def idle_denominator(record: dict[str, Any]) -> tuple[int, tuple[str | None, ...]]:
    """The reward's idle denominator and the actions it counts as idle (`paper`: turns with an
    action, the protocol's idle action; `shaped`: all turns, null actions idle too)."""
    idle_action = IDLE_ACTIONS[record["protocol"]]
    turns = record["turns"]
    if record["reward"]["variant"] == "paper":
        return sum(1 for t in turns if t["action"] is not None), (idle_action,)
    return len(turns), (idle_action, None)


def _idle_shares(s: _Seats, weight: float) -> list[list[float]]:
    """N / the reward's idle denominator for each idle turn (see `idle_denominator`)."""
    out = s.zeros()
    denom, idle_actions = idle_denominator(s.record)
    for t in s.record["turns"]:
        if t["action"] in idle_actions:
            out[t["philosopher"]][t["round"] - 1] += weight * s.n / denom
    return out


# Each reward term's per-seat share, [philosopher][round - 1], weighted: averaged over the
# seats and summed over the rounds it is that term of the episode reward. Keyed by
# `TERMS`' names; a test fails when a term is missing here.
SEAT_SHARES: dict[str, Callable[[_Seats, float], list[list[float]]]] = {
    "no_deadlock": _no_deadlock_shares,
    "throughput": _throughput_shares,
    "fairness": _fairness_shares,
    "idle": _idle_shares,
}
