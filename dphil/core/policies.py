"""Built-in scripted philosophers (`-m scripted:NAME`).

They need no network and are deterministic per seed, so they serve as
baselines (`random`), known failures (`naive` deadlocks, `idle` games the
published reward), an upper bound (`hierarchy`, Dijkstra's resource ordering)
and test fixtures. Each works in both protocols.

A policy is a function ``(table, i, rng) -> action name or None`` that reads the
live table; under the simultaneous schedule nothing changes on the table while
the philosophers choose, so reading it equals reading the snapshot.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from dphil.core.protocols import IDLE_ACTIONS, PROTOCOLS
from dphil.core.table import FREE, Table

_ACTIONS = {name: tuple(actions) for name, actions in PROTOCOLS.items()}

Policy = Callable[[Table, int, "random.Random | None"], "str | None"]


def _ate_last(table: Table, i: int) -> bool:
    last = table.last[i]
    return last is not None and last["action"] == "eat" and last["ok"]


def random_policy(table: Table, i: int, rng: random.Random | None) -> str | None:
    """Uniform over the protocol's actions."""
    actions = _ACTIONS[table.protocol]
    return actions[int(rng.random() * len(actions))]  # type: ignore[union-attr]


random_policy.uses_rng = True  # type: ignore[attr-defined]


def naive(table: Table, i: int, rng: random.Random | None) -> str | None:
    """Left fork, then right, then eat, then put both down; deadlocks when all start together."""
    holder = table.holder
    right = (i + 1) % table.n
    hl, hr = holder[i] == i, holder[right] == i
    if table.protocol == "dpbench":
        if hl and hr:
            return "release"
        if hl:
            return "grab-right"
        if hr:
            return "release"
        return "grab-left"
    if hl and hr:
        return "put-down-left" if _ate_last(table, i) else "eat"
    if hl:
        return "pick-up-right"
    if hr:
        return "put-down-right"
    return "pick-up-left"


def hierarchy(table: Table, i: int, rng: random.Random | None) -> str | None:
    """Dijkstra's resource ordering: lower-numbered fork first, higher released first.

    Whoever holds exactly one fork holds its lower one, and philosophers 0 and
    N-1 share the same lower fork, so the table can never reach the state where
    everyone holds one fork: no deadlock, in either schedule.
    """
    holder = table.holder
    right = i + 1 if i + 1 < table.n else 0
    paper = table.protocol == "paper"
    if i < right:  # the lower fork is the left one
        lo, hi = i, right
        take_lo, take_hi, drop_hi = _LEFT_FIRST[paper]
    else:  # the last philosopher: fork 0, its right one, is the lower
        lo, hi = right, i
        take_lo, take_hi, drop_hi = _RIGHT_FIRST[paper]
    h_lo, h_hi = holder[lo] == i, holder[hi] == i
    if not paper:
        if h_lo and h_hi:
            return "wait"  # eating; the table releases both forks after this round
        if h_hi:
            return "release"
        if h_lo:
            return take_hi if holder[hi] == FREE else "wait"
        return take_lo if holder[lo] == FREE else "wait"
    if h_lo and h_hi:
        return drop_hi if _ate_last(table, i) else "eat"
    if h_hi:
        return drop_hi
    if h_lo:
        return take_hi if holder[hi] == FREE else "think"
    return take_lo if holder[lo] == FREE else "think"


# (take lower fork, take higher fork, drop higher fork), by "is the paper protocol".
_LEFT_FIRST = {True: ("pick-up-left", "pick-up-right", "put-down-right"), False: ("grab-left", "grab-right", "release")}
_RIGHT_FIRST = {True: ("pick-up-right", "pick-up-left", "put-down-left"), False: ("grab-right", "grab-left", "release")}


def idle(table: Table, i: int, rng: random.Random | None) -> str | None:
    """Emits no action at all: the table where nobody acts (1.0 under the paper reward)."""
    return None


def thinker(table: Table, i: int, rng: random.Random | None) -> str | None:
    """Always the explicit do-nothing action (`think`, or `wait` in dpbench)."""
    return IDLE_ACTIONS[table.protocol]


def greedy(table: Table, i: int, rng: random.Random | None) -> str | None:
    """Grabs a free fork (a coin decides when both are free) and, once it has both, eats forever.

    It never puts a fork down, so a greedy table either deadlocks or lets a
    few philosophers eat while their neighbours starve: the fairness penalty's
    test case.
    """
    holder = table.holder
    right = (i + 1) % table.n
    hl, hr = holder[i] == i, holder[right] == i
    paper = table.protocol == "paper"
    if hl and hr:
        return "eat" if paper else "wait"  # eating, in dpbench, is waiting while holding both
    can_left = not hl and holder[i] == FREE
    can_right = not hr and holder[right] == FREE
    if can_left and can_right:
        can_left = rng.random() < 0.5  # type: ignore[union-attr]
        can_right = not can_left
    if can_left:
        return "pick-up-left" if paper else "grab-left"
    if can_right:
        return "pick-up-right" if paper else "grab-right"
    return IDLE_ACTIONS[table.protocol]


greedy.uses_rng = True  # type: ignore[attr-defined]


POLICIES: dict[str, Policy] = {
    "random": random_policy,
    "naive": naive,
    "hierarchy": hierarchy,
    "idle": idle,
    "thinker": thinker,
    "greedy": greedy,
}


def get_policy(name: str) -> Policy:
    """Look up a scripted policy by name; KeyError lists the known names."""
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise KeyError(f"unknown scripted policy {name!r} (known: {known})") from None
