"""The counterfactual credit mode's difference baseline: what else could this seat have done?

For each turn the round is played again from the recorded table state with the acting
philosopher's other actions while everyone else's recorded actions stay fixed (difference
rewards, Wolpert and Tumer; COMA's counterfactual baseline without a learned critic: the
simulator is exact and cheap). Pure and deterministic: contested forks fall by the
episode's own conflict rule (`lowest-id`, or the seed's coin for `random`), the same rule
that played the episode, and the replay checks that it reproduces every recorded outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dphil.core.conflicts import Resolver, lowest_id, random_resolver
from dphil.core.protocols import protocol_actions
from dphil.core.table import Table
from dphil.io.errors import UsageError
from dphil.train.returns import idle_denominator


def counterfactual_differences(record: dict[str, Any]) -> list[float]:
    """Per turn (aligned with `turns`): u(chosen action) - the mean of u over the seat's other actions.

    u is the round's immediate outcome for the table: the round played from the
    recorded state at its start with this seat's action swapped, the others' kept,
    the round's end applied (dpbench's automatic eating, the deadlock check):

        u = beta * meals eaten at the table in the round / (N * R)
            - delta * idle turns of the round / D
            - alpha * [the table is deadlocked at the round's end]

    with the record's reward weights, R the configured rounds and D the reward's
    idle denominator of the recorded episode (a constant, so the alternatives are
    compared on one scale; no idle term when D is 0). That is the round's
    contribution to the episode reward with fairness (not a property of one round)
    left out and a deadlock charged the whole no-deadlock term. The other actions
    are the protocol's actions other than the chosen one (all of them after a null
    reply). A turn whose every alternative ends the round the same way gets 0.
    """
    n, turns = record["n"], record["turns"]
    if len(turns) % n:
        raise ValueError("an episode's turns must hold one turn per philosopher per round")
    resolve = _resolver(record)
    w = record["reward"]["weights"]
    denom, idle = idle_denominator(record)
    actions_of = protocol_actions(record["protocol"])
    table = _table(record, resolve)
    simultaneous = record["schedule"] == "simultaneous"

    def outcome(profile: Sequence[str | None]) -> float:
        t = _clone(table, record, resolve)
        before = sum(t.meals)
        (t.resolve_round if simultaneous else t.resolve_sequential_round)(profile, copy=False)
        deadlock = t.end_round()
        idle_turns = sum(1 for a in profile if a in idle)
        u = w["beta"] * (sum(t.meals) - before) / (n * record["rounds"]) - w["alpha"] * deadlock
        return u - (w["delta"] * idle_turns / denom if denom else 0.0)

    out: list[float] = []
    for k in range(0, len(turns), n):
        chunk = turns[k : k + n]
        actions: list[str | None] = [None] * n
        for t in chunk:
            actions[t["philosopher"]] = t["action"]
        chosen = outcome(actions)
        diff = {}
        for i in range(n):
            others = [a for a in actions_of if a != actions[i]]
            alt = [outcome([*actions[:i], a, *actions[i + 1 :]]) for a in others]
            diff[i] = chosen - sum(alt) / len(alt)
        out.extend(diff[t["philosopher"]] for t in chunk)
        _advance(table, record, actions, chunk, simultaneous)
    return out


def _resolver(record: dict[str, Any]) -> Resolver:
    """The episode's own conflict rule; a record without one cannot be replayed with other actions."""
    conflict = record.get("conflict")
    if conflict == "lowest-id":
        return lowest_id
    if conflict == "random" and type(record.get("seed")) is int:
        return random_resolver(record["seed"])
    raise UsageError(
        f"--advantage counterfactual cannot replay episode {record.get('episode_id')}: "
        f"conflict {conflict!r} with seed {record.get('seed')!r} does not say who wins a contested fork"
    )


def _table(record: dict[str, Any], resolve: Resolver) -> Table:
    return Table(
        record["n"],
        record["rounds"],
        protocol=record["protocol"],
        deadlock_mode=record.get("deadlock_mode", "terminal"),
        resolve=resolve,
    )


def _clone(table: Table, record: dict[str, Any], resolve: Resolver) -> Table:
    """A table in the same state at the start of a round (what the round's resolution reads)."""
    t = _table(record, resolve)
    t.holder = list(table.holder)
    t.meals = list(table.meals)
    t.eating = list(table.eating)
    t.round = table.round
    return t


def _advance(
    table: Table, record: dict[str, Any], actions: list[str | None], chunk: Sequence[dict], simultaneous: bool
) -> None:
    """Play the recorded round; refuse (exit 64) a record whose outcomes the replay does not reproduce."""
    got = (table.resolve_round if simultaneous else table.resolve_sequential_round)(actions, copy=False)
    ok = {t["philosopher"]: t["ok"] for t in got}
    if any(ok[t["philosopher"]] != t["ok"] for t in chunk):
        raise UsageError(
            f"--advantage counterfactual cannot replay episode {record.get('episode_id')} exactly: round "
            f"{table.round}'s recorded outcomes are not those of its {record.get('conflict')} conflict rule"
        )
    table.end_round()
