"""Credit assignment: one advantage per turn, from the episode, the seat, the step, the seat's
turn, or what else the seat could have done.

GRPO as the study ran it gives every turn of an episode that episode's
group-relative advantage, so the philosopher whose grab deadlocked the table
is credited exactly like the one who waited. These pure functions take the
scored episodes of one group (one scenario played several times, same seed and
configuration) and return an advantage per turn, aligned with each record's `turns`:

* `episode`: A = (R - mean) / (std + eps) over the group's episode rewards R
  (the study's; every turn of an episode gets its episode's A).
* `philosopher`: the episode reward split into one return per philosopher
  whose mean over the table is the episode reward exactly (see
  `dphil.train.returns.philosopher_returns`; a deadlock blames every holder in
  the cycle by how long it held and waited, `dphil.train.blame`), normalised per
  seat across the group's episodes; every turn of philosopher i in episode e gets A(e, i).
* `step` (GiGPO, arXiv 2505.10978): turns of different episodes in which the
  same seat saw the same table state (`state_key`) form a step group; the
  philosopher's discounted return from that turn on (`turn_returns`) is
  normalised within it; the turn's advantage is the episode advantage plus
  `weight` times that step advantage. A step group of one contributes 0.
* `agent-turn` (AT-GRPO, arXiv 2510.11062): philosopher i's t-th turn in each
  episode of the group form one comparison group (the episodes share seed and
  configuration); the same discounted return from the turn on is normalised
  within it, and is the turn's advantage. A group of one (only one episode
  lasted that long) gives 0.
* `counterfactual`: the turn's difference from its counterfactual baseline
  (`dphil.train.counterfactual`: the round replayed with the seat's other
  actions, the others' fixed), normalised over all the turns of the group.

A comparison group whose returns all tie gives zero advantages and is counted
in `tied` (never a division by zero). `scale=False` drops the division by the
standard deviation everywhere (Dr. GRPO's r - mean).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from dphil.train.blame import BLAME_RULE
from dphil.train.counterfactual import counterfactual_differences
from dphil.train.grpo import GroupAdvantages, group_advantages
from dphil.train.replay import state_keys
from dphil.train.returns import SEAT_SHARES, philosopher_returns, turn_returns

# Re-exported: the per-seat returns and state keys have lived here since the modes began.
__all__ = [
    "DEFAULT_GAMMA",
    "DEFAULT_WEIGHT",
    "MODES",
    "SEAT_SHARES",
    "AdvantageSpec",
    "CreditMode",
    "TurnAdvantages",
    "keyed_advantages",
    "modes_using",
    "philosopher_returns",
    "state_keys",
    "turn_advantages",
    "turn_returns",
]

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
        """The mode, the parameters it uses (`CreditMode.params`) and its blame rule, if any.

        The blame rule is recorded so that a run started under an earlier rule (only the seat
        that closed the cycle) refuses to resume under this one instead of mixing the two.
        """
        mode = MODES[self.mode]
        blame = {"blame": BLAME_RULE} if mode.blame else {}
        return {"mode": self.mode, **{p: getattr(self, p) for p in mode.params}, **blame}


@dataclass
class TurnAdvantages:
    """Per-episode, per-turn advantages of one group, and how many comparisons carried no signal."""

    turns: list[list[float]]  # [episode][turn], aligned with record["turns"]
    episode: list[float]  # the episode-level advantages
    # comparison groups: 1 (episode, counterfactual), seats (philosopher), groups of >= 2 (step, agent-turn)
    groups: int
    tied: int  # of those, groups whose returns all tie (zero advantages)
    singletons: int = 0  # step, agent-turn: turns no other episode of the group could be compared with
    episode_tied: bool = False  # every episode of the group scored the same (zero_std)


def turn_advantages(records: Sequence[dict[str, Any]], spec: AdvantageSpec, *, scale: bool = True) -> TurnAdvantages:
    """The advantage of every turn of every scored episode of one group (one scenario)."""
    if not records:
        raise ValueError("a group needs at least one episode")
    ep = group_advantages([r["reward"]["total"] for r in records], scale=scale)
    out = MODES[spec.mode].assign(records, ep, spec, scale)
    out.episode_tied = ep.zero_std
    return out


def keyed_advantages(
    keys: Sequence[Sequence[Hashable]], values: Sequence[Sequence[float]], *, scale: bool = True
) -> tuple[list[list[float]], int, int, int]:
    """Normalise values within the groups of equal keys: ([episode][turn] advantages, groups, tied, singletons).

    Turns with the same key (across and within episodes) form one comparison
    group, normalised as `group_advantages` does; a key seen once gives 0 and is
    counted in `singletons`, a group whose values all tie gives zeros and is counted in `tied`.
    """
    members: dict[Hashable, list[tuple[int, int, float]]] = {}
    for e, (ks, vs) in enumerate(zip(keys, values, strict=True)):
        for k, (key, v) in enumerate(zip(ks, vs, strict=True)):
            members.setdefault(key, []).append((e, k, v))
    out = [[0.0] * len(vs) for vs in values]
    groups = tied = singletons = 0
    for group in members.values():
        if len(group) < 2:
            singletons += 1
            continue
        groups += 1
        adv = group_advantages([v for _, _, v in group], scale=scale)
        tied += adv.zero_std
        for (e, k, _), a in zip(group, adv.advantages, strict=True):
            out[e][k] = a
    return out, groups, tied, singletons


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
    step, groups, tied, singletons = keyed_advantages(
        [state_keys(r) for r in records], [turn_returns(r, spec.gamma) for r in records], scale=scale
    )
    turns = [[episode[e] + spec.weight * a for a in step[e]] for e in range(len(records))]
    return TurnAdvantages(turns, episode, groups, tied, singletons)


def _agent_turn(
    records: Sequence[dict[str, Any]], ep: GroupAdvantages, spec: AdvantageSpec, scale: bool
) -> TurnAdvantages:
    _same_n(records)
    turns, groups, tied, singletons = keyed_advantages(
        [agent_turn_keys(r) for r in records], [turn_returns(r, spec.gamma) for r in records], scale=scale
    )
    return TurnAdvantages(turns, ep.advantages, groups, tied, singletons)


def agent_turn_keys(record: dict[str, Any]) -> list[tuple[int, int]]:
    """(philosopher, how many turns it had taken before) for each turn: AT-GRPO's group key."""
    seen: dict[int, int] = {}
    out = []
    for t in record["turns"]:
        i = t["philosopher"]
        out.append((i, seen.get(i, 0)))
        seen[i] = seen.get(i, 0) + 1
    return out


def _counterfactual(
    records: Sequence[dict[str, Any]], ep: GroupAdvantages, spec: AdvantageSpec, scale: bool
) -> TurnAdvantages:
    _same_n(records)
    diffs = [counterfactual_differences(r) for r in records]
    flat = [d for ds in diffs for d in ds]
    if not flat:
        return TurnAdvantages([[] for _ in records], ep.advantages, 1, 1)
    adv = group_advantages(flat, scale=scale)
    turns, k = [], 0
    for ds in diffs:
        turns.append(adv.advantages[k : k + len(ds)])
        k += len(ds)
    return TurnAdvantages(turns, ep.advantages, 1, int(adv.zero_std))


@dataclass(frozen=True)
class CreditMode:
    """One credit mode: its function, the one line `dphil-train --help` shows, the spec fields it uses."""

    assign: Callable[[Sequence[dict[str, Any]], GroupAdvantages, AdvantageSpec, bool], TurnAdvantages]
    summary: str
    params: tuple[str, ...] = ()
    blame: bool = False  # splits a deadlock's cost among the seats (`blame.BLAME_RULE`)


# The credit modes, name -> mode: the one home the CLI's choices and help (`dphil-train
# --advantage`), the spec's check, the records and the ART backend derive from.
MODES: dict[str, CreditMode] = {
    "episode": CreditMode(_episode, "every turn gets its episode's group advantage, the study's"),
    "philosopher": CreditMode(_philosopher, "each philosopher's own share of the reward, per seat", blame=True),
    "step": CreditMode(
        _step,
        "GiGPO: episode advantage + weight x advantage among turns that saw the same state",
        ("gamma", "weight"),
        blame=True,
    ),
    "agent-turn": CreditMode(
        _agent_turn,
        "AT-GRPO: each seat's return from its t-th turn, compared across the group",
        ("gamma",),
        blame=True,
    ),
    "counterfactual": CreditMode(
        _counterfactual, "the round's outcome minus its mean over the seat's other actions, others fixed"
    ),
}


def modes_using(param: str) -> list[str]:
    """The modes whose spec uses `param` (gamma, weight): who a --advantage-<param> applies to."""
    return [name for name, m in MODES.items() if param in m.params]


def _same_n(records: Sequence[dict[str, Any]]) -> int:
    sizes = {r["n"] for r in records}
    if len(sizes) != 1:
        raise ValueError(f"a group's episodes must share a table size, not {sorted(sizes)}")
    return sizes.pop()
