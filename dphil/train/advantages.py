"""Credit assignment: one advantage per turn, from the episode, the philosopher or the step.

GRPO as the study ran it gives every turn of an episode that episode's
group-relative advantage, so the philosopher whose grab deadlocked the table
is credited exactly like the one who waited. These pure functions take the
scored episodes of one group (one scenario played several times) and return
an advantage per turn, aligned with each record's `turns`:

* `episode`: A = (R - mean) / (std + eps) over the group's episode rewards R
  (the study's; every turn of an episode gets its episode's A).
* `philosopher`: the episode reward split into one return per philosopher
  whose mean over the table is the episode reward exactly (see
  `philosopher_returns`), normalised per seat across the group's episodes;
  every turn of philosopher i in episode e gets A(e, i).
* `step` (GiGPO, arXiv 2505.10978): turns of different episodes in which the
  same seat saw the same table state (`state_key`) form a step group; the
  philosopher's discounted return from that turn on (`turn_returns`) is
  normalised within it; the turn's advantage is the episode advantage plus
  `weight` times that step advantage. A step group of one contributes 0.

A comparison group whose returns all tie gives zero advantages and is counted
in `tied` (never a division by zero). `scale=False` drops the division by the
standard deviation everywhere (Dr. GRPO's r - mean).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dphil.core.episode import recorded_winner
from dphil.core.protocols import IDLE_ACTIONS, PICK_LEFT, PICK_RIGHT
from dphil.core.table import Table
from dphil.scoring.reward import TERMS
from dphil.train.grpo import GroupAdvantages, group_advantages

DEFAULT_GAMMA = 0.95  # GiGPO's discount
DEFAULT_WEIGHT = 1.0  # GiGPO's omega


@dataclass(frozen=True)
class AdvantageSpec:
    """Which credit assignment, and its parameters (recorded with every checkpoint)."""

    mode: str = "episode"
    gamma: float = DEFAULT_GAMMA
    weight: float = DEFAULT_WEIGHT

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown advantage mode {self.mode!r} (expected {', '.join(MODES)})")
        if not (isinstance(self.gamma, (int, float)) and 0.0 <= self.gamma <= 1.0):
            raise ValueError(f"the step discount gamma must be in [0, 1], not {self.gamma!r}")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"the step weight must be a finite number >= 0, not {self.weight!r}")

    def as_record(self) -> dict[str, Any]:
        """The mode and the parameters it uses (step alone uses gamma and weight)."""
        if self.mode == "step":
            return {"mode": self.mode, "gamma": self.gamma, "weight": self.weight}
        return {"mode": self.mode}


@dataclass
class TurnAdvantages:
    """Per-episode, per-turn advantages of one group, and how many comparisons carried no signal."""

    turns: list[list[float]]  # [episode][turn], aligned with record["turns"]
    episode: list[float]  # the episode-level advantages
    groups: int  # comparison groups: 1 (episode), seats (philosopher), step groups of >= 2 (step)
    tied: int  # of those, groups whose returns all tie (zero advantages)
    singletons: int = 0  # step mode: turns whose state no other episode of the group saw
    episode_tied: bool = False  # every episode of the group scored the same (zero_std)


def turn_advantages(records: Sequence[dict[str, Any]], spec: AdvantageSpec, *, scale: bool = True) -> TurnAdvantages:
    """The advantage of every turn of every scored episode of one group (one scenario)."""
    if not records:
        raise ValueError("a group needs at least one episode")
    ep = group_advantages([r["reward"]["total"] for r in records], scale=scale)
    out = MODES[spec.mode](records, ep, spec, scale)
    out.episode_tied = ep.zero_std
    return out


def _episode(
    records: Sequence[dict[str, Any]], ep: GroupAdvantages, spec: AdvantageSpec, scale: bool
) -> TurnAdvantages:
    return TurnAdvantages(
        [[a] * len(r["turns"]) for r, a in zip(records, ep.advantages, strict=True)],
        ep.advantages,
        1,
        int(ep.zero_std),
    )


def _philosopher(
    records: Sequence[dict[str, Any]], ep: GroupAdvantages, spec: AdvantageSpec, scale: bool
) -> TurnAdvantages:
    episode = ep.advantages
    n = _same_n(records)
    returns = [philosopher_returns(r) for r in records]
    per_seat = []
    tied = 0
    for i in range(n):
        adv = group_advantages([ret[i] for ret in returns], scale=scale)
        tied += adv.zero_std
        per_seat.append(adv.advantages)
    turns = [[per_seat[t["philosopher"]][e] for t in r["turns"]] for e, r in enumerate(records)]
    return TurnAdvantages(turns, episode, n, tied)


def _step(records: Sequence[dict[str, Any]], ep: GroupAdvantages, spec: AdvantageSpec, scale: bool) -> TurnAdvantages:
    episode = ep.advantages
    _same_n(records)
    members: dict[tuple, list[tuple[int, int, float]]] = {}
    for e, r in enumerate(records):
        for k, (key, ret) in enumerate(zip(state_keys(r), turn_returns(r, spec.gamma), strict=True)):
            members.setdefault(key, []).append((e, k, ret))
    step = [[0.0] * len(r["turns"]) for r in records]
    groups = tied = singletons = 0
    for group in members.values():
        if len(group) < 2:
            singletons += 1
            continue
        groups += 1
        adv = group_advantages([ret for _, _, ret in group], scale=scale)
        tied += adv.zero_std
        for (e, k, _), a in zip(group, adv.advantages, strict=True):
            step[e][k] = a
    turns = [[episode[e] + spec.weight * a for a in step[e]] for e in range(len(records))]
    return TurnAdvantages(turns, episode, groups, tied, singletons)


# The credit modes, name -> implementation: the one home the CLI's choices
# (`dphil-train --advantage`), the spec's check and the ART backend derive from.
MODES: dict[str, Callable[[Sequence[dict[str, Any]], GroupAdvantages, AdvantageSpec, bool], TurnAdvantages]] = {
    "episode": _episode,
    "philosopher": _philosopher,
    "step": _step,
}


def _same_n(records: Sequence[dict[str, Any]]) -> int:
    sizes = {r["n"] for r in records}
    if len(sizes) != 1:
        raise ValueError(f"a group's episodes must share a table size, not {sorted(sizes)}")
    return sizes.pop()


# -- per-philosopher returns ---------------------------------------------------------------------


def philosopher_returns(record: dict[str, Any]) -> list[float]:
    """Philosopher i's share of its episode's reward; their mean over the table is the reward.

    With the record's weights (alpha, beta, gamma, delta), N philosophers, R
    configured rounds, M_i the meals of i and M the mean of M_i:

        R_i = alpha * nd_i + beta * M_i / R - gamma * (M_i - M)^2 - delta * idle_i

    * nd_i, the no-deadlock share: the episode's no-deadlock term when it did
      not deadlock (1, or 0 when the shaped reward's meal floor was missed).
      After a deadlock, 1 - N * b_i, where the blame b_i is split equally
      among the philosophers whose pick-up succeeded in the first deadlock
      round (they completed the cycle), or among all N if none did; the
      others keep 1. The shares average to 0, the episode's term.
    * idle_i = N * idle turns of i / the reward's denominator (turns with an
      action under `paper`, all turns under `shaped`, which also counts null
      actions as idle), so the shares average to the episode's idle term.
    """
    return [sum(rs) for rs in _round_rewards(record)]


def turn_returns(record: dict[str, Any], gamma: float) -> list[float]:
    """The acting philosopher's discounted return from each turn on (aligned with `turns`).

    A philosopher's reward in round t is beta * (meals eaten in t) / R minus
    delta times its idle share of the turn; the no-deadlock share and the
    fairness term are paid in the last round played, except a deadlock's blame
    share, paid in the first deadlock round. Undiscounted (gamma = 1), the
    return from a philosopher's first turn is its `philosopher_returns`.
    """
    rewards = _round_rewards(record)
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


def _round_rewards(record: dict[str, Any]) -> list[list[float]]:
    """[philosopher][round - 1]: each philosopher's reward per round played (see turn_returns).

    The sum over the reward's terms (`dphil.scoring.reward.TERMS`) of each term's
    signed, weighted per-seat share (`SEAT_SHARES`).
    """
    reward = record["reward"]
    w = reward["weights"]
    seats = _Seats(record, _replay(record))
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
    replay: _Replayed

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
    played; after a deadlock, 1 - N * blame in the first deadlock round, the blame split equally
    among the philosophers whose pick-up completed the cycle (all N if none did)."""
    out, n = s.zeros(), s.n
    if s.replay.deadlock_round is None:
        shares = [s.record["reward"]["components"]["no_deadlock"]] * n
        pay_at = s.played - 1
    else:
        blamed = s.replay.completers or list(range(n))
        shares = [1.0 - (n / len(blamed) if i in blamed else 0.0) for i in range(n)]
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


def _idle_shares(s: _Seats, weight: float) -> list[list[float]]:
    """N / the reward's denominator for each idle turn (`paper`: turns with an action, idle =
    the protocol's idle action; `shaped`: all turns, null actions idle too)."""
    record, out = s.record, s.zeros()
    idle_action = IDLE_ACTIONS[record["protocol"]]
    turns = record["turns"]
    if record["reward"]["variant"] == "paper":
        denom = sum(1 for t in turns if t["action"] is not None)
        idle_actions: tuple[str | None, ...] = (idle_action,)
    else:
        denom = len(turns)
        idle_actions = (idle_action, None)
    for t in turns:
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


# -- table states ----------------------------------------------------------------------------------


def state_keys(record: dict[str, Any]) -> list[tuple]:
    """What the acting seat saw before each turn (aligned with `turns`): its step-group key.

    (seat, round, holds left fork, holds right fork, left fork free, right fork
    free, own meals so far, eating): the table as the observation shows it,
    without the last action's outcome (the same state reached by different
    histories is the same state, as in GiGPO's anchor states). The round is in
    the key because the horizon is finite: the same forks in round 2 and in
    round 7 have different futures.
    """
    return _replay(record).keys


@dataclass
class _Replayed:
    keys: list[tuple]
    meals_by_round: list[list[int]]
    deadlock_round: int | None
    completers: list[int]


def _replay(record: dict[str, Any]) -> _Replayed:
    """Play a record's turns through the table again, noting what each seat saw and ate."""
    n = record["n"]
    turns = record["turns"]
    if len(turns) % n:
        raise ValueError("an episode's turns must hold one turn per philosopher per round")
    chunk: list[dict[str, Any]] = []
    table = Table(
        n,
        record["rounds"],
        protocol=record["protocol"],
        deadlock_mode=record.get("deadlock_mode", "terminal"),
        resolve=recorded_winner(record, chunk),
    )
    keys: list[tuple] = []
    meals_by_round: list[list[int]] = []
    deadlock_round = None
    completers: list[int] = []
    simultaneous = record["schedule"] == "simultaneous"
    for k in range(0, len(turns), n):
        chunk[:] = turns[k : k + n]
        before = list(table.meals)
        actions: list[str | None] = [None] * n
        for t in chunk:
            actions[t["philosopher"]] = t["action"]
        seen: dict[int, tuple] = {}
        if simultaneous:
            for i in range(n):
                seen[i] = _key(table, i)
            table.resolve_round(actions)
        else:
            for i in range(n):
                seen[i] = _key(table, i)
                table.act(i, actions[i])
        keys.extend(seen[t["philosopher"]] for t in chunk)
        rnd = table.round
        if table.end_round() and deadlock_round is None:
            deadlock_round = rnd
            completers = sorted(
                t["philosopher"]
                for t in chunk
                if t["ok"] and t["action"] is not None and table.code(t["action"]) in (PICK_LEFT, PICK_RIGHT)
            )
        meals_by_round.append([a - b for a, b in zip(table.meals, before, strict=True)])
    return _Replayed(keys, meals_by_round, deadlock_round, completers)


def _key(table: Table, i: int) -> tuple:
    o = table.observe(i)
    return (i, o.round, o.holds_left, o.holds_right, o.left_free, o.right_free, o.meals, o.eating)
