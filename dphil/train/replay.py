"""A scored episode played through the table again, for credit assignment.

The advantages need what the record does not store: the table state each seat saw
before acting, the meals of each round, and who held which fork round by round (the
deadlock blame). Replaying the recorded actions through the same engine gives all three;
contested forks are settled as the record says they were (`recorded_winner`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dphil.core.episode import recorded_winner
from dphil.core.table import Table


@dataclass
class Replayed:
    """What credit assignment reads from one replayed episode."""

    keys: list[tuple]  # the acting seat's state before each turn, aligned with `turns`
    meals_by_round: list[list[int]]  # [round - 1][seat]: meals eaten in that round
    deadlock_round: int | None  # the first round that ended deadlocked
    holders_by_round: list[list[int]]  # [round - 1][fork]: its holder at the round's end (-1 free)


def replay(record: dict[str, Any]) -> Replayed:
    """Play a record's turns through the table again, noting what each seat saw, ate and held."""
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
    holders_by_round: list[list[int]] = []
    deadlock_round = None
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
        eating = list(table.eating)
        held = list(table.holder)
        if table.end_round():
            # The holders at the deadlock, before `continue` mode's forced release: dpbench's
            # automatic release of the eaters happens first and nobody eats in a deadlock.
            holders_by_round.append([-1 if h >= 0 and eating[h] else h for h in held])
            if deadlock_round is None:
                deadlock_round = rnd
        else:
            holders_by_round.append(list(table.holder))
        meals_by_round.append([a - b for a, b in zip(table.meals, before, strict=True)])
    return Replayed(keys, meals_by_round, deadlock_round, holders_by_round)


def state_keys(record: dict[str, Any]) -> list[tuple]:
    """What the acting seat saw before each turn (aligned with `turns`): its step-group key.

    (seat, round, holds left fork, holds right fork, left fork free, right fork
    free, own meals so far, eating): the table as the observation shows it,
    without the last action's outcome (the same state reached by different
    histories is the same state, as in GiGPO's anchor states). The round is in
    the key because the horizon is finite: the same forks in round 2 and in
    round 7 have different futures.
    """
    return replay(record).keys


def _key(table: Table, i: int) -> tuple:
    o = table.observe(i)
    return (i, o.round, o.holds_left, o.holds_right, o.left_free, o.right_free, o.meals, o.eating)
