"""Playing one episode with a scripted policy, and replaying a recorded one.

Replay is how `dphil-score` trusts nothing it reads: the recorded actions are
played through the same table, and the turns, meals and deadlock it produces
must equal the recorded ones.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .errors import DataError
from .policies import Policy
from .records import EpisodeConfig, episode_record
from .table import Resolver, Table, lowest_id, random_resolver

# The policy's random stream is kept apart from the table's conflict coin so
# that changing a policy never changes how conflicts fall for the same seed.
_POLICY_STREAM = 0x5EED_0F_D1


def new_table(config: EpisodeConfig, resolve: Resolver | None = None) -> Table:
    """A fresh table for `config`, with its seeded conflict resolver."""
    if resolve is None:
        resolve = lowest_id if config.conflict == "lowest-id" else _lazy_random(config.seed)
    return Table(
        config.n,
        config.rounds,
        protocol=config.protocol,
        deadlock_mode=config.deadlock_mode,
        resolve=resolve,
    )


def _lazy_random(seed: int) -> Resolver:
    """A seeded coin for conflicts, created on the first conflict only (most rounds have none)."""
    coin: list[Resolver] = []

    def resolve(rnd: int, fork: int, a: int, b: int) -> int:
        if not coin:
            coin.append(random_resolver(random.Random(seed)))
        return coin[0](rnd, fork, a, b)

    return resolve


def play(config: EpisodeConfig, policy: Policy) -> dict[str, Any]:
    """Play one whole episode with a scripted policy and return its record."""
    table = new_table(config)
    rng = random.Random(config.seed ^ _POLICY_STREAM)
    n = config.n
    philosophers = range(n)
    if config.schedule == "simultaneous":
        while not table.over:
            table.play_simultaneous([policy(table, i, rng) for i in philosophers])
    else:
        while not table.over:
            for i in philosophers:
                table.act(i, policy(table, i, rng))
            table.end_round()
    return episode_record(config, table)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What replaying a record's turns produced."""

    meals: list[int]
    deadlock: bool
    deadlock_round: int | None
    rounds_played: int
    turns: list[dict]


def replay(record: dict[str, Any]) -> Outcome:
    """Replay a record's turns through the table and check they are what the table does.

    Contested forks under `conflict: random` are given to whichever contender
    the record says won; everything else (failures, meals, deadlock) must
    follow from the rules. Raises DataError on the first disagreement.
    """
    n, rounds = record["n"], record["rounds"]
    protocol, schedule = record["protocol"], record["schedule"]
    turns = record["turns"]
    by_round: dict[int, dict[int, dict]] = {}
    for k, t in enumerate(turns):
        if not isinstance(t, dict):
            raise DataError(f"turns[{k}] should be an object")
        try:
            r, i = t["round"], t["philosopher"]
            t["action"], t["ok"], t["reason"]  # noqa: B018 - presence check
        except KeyError as e:
            raise DataError(f"turns[{k}] is missing field {e.args[0]!r}") from None
        if type(r) is not int or type(i) is not int or not (0 <= i < n) or not (1 <= r <= rounds):
            raise DataError(f"turns[{k}] has round {r!r} / philosopher {i!r} outside the table")
        seat = by_round.setdefault(r, {})
        if i in seat:
            raise DataError(f"philosopher {i} acts twice in round {r}")
        seat[i] = t

    if record.get("conflict") == "lowest-id":
        resolve: Resolver = lowest_id
    else:
        def resolve(rnd: int, fork: int, a: int, b: int) -> int:
            seat = by_round[rnd]
            a_won, b_won = seat[a]["ok"], seat[b]["ok"]
            if a_won == b_won:
                raise DataError(
                    f"round {rnd}: philosophers {a} and {b} both reached for fork {fork} "
                    "but the record does not say exactly one of them got it"
                )
            return a if a_won else b

    try:
        table = Table(n, rounds, protocol=protocol, deadlock_mode=record.get("deadlock_mode", "terminal"),
                      resolve=resolve)
    except ValueError as e:
        raise DataError(str(e)) from None
    played = len(by_round)
    if sorted(by_round) != list(range(1, played + 1)):
        raise DataError(f"rounds recorded are not 1..{played}: {sorted(by_round)}")
    for r in range(1, played + 1):
        if table.over:
            raise DataError(f"the episode ended at round {table.round} but turns continue to round {played}")
        seat = by_round[r]
        if len(seat) != n:
            missing = sorted(set(range(n)) - set(seat))
            raise DataError(f"round {r}: no turn for philosopher(s) {missing}")
        try:
            if schedule == "simultaneous":
                table.play_simultaneous([seat[i]["action"] for i in range(n)])
            else:
                for i in range(n):
                    table.act(i, seat[i]["action"])
                table.end_round()
        except ValueError as e:
            raise DataError(f"round {r}: {e}") from None
    if played and not table.over:
        raise DataError(f"the record stops after round {played} of {rounds} with no deadlock to end it")
    for k, (got, want) in enumerate(zip(table.turns, turns, strict=True)):
        if (
            got["round"] != want["round"]
            or got["philosopher"] != want["philosopher"]
            or got["action"] != want["action"]
            or got["ok"] is not want["ok"]
            or got["reason"] != want["reason"]
        ):
            raise DataError(
                f"turns[{k}] disagrees with the table: recorded {_turn_text(want)}, "
                f"replay gives {_turn_text(got)}"
            )
    dl = table.deadlock_rounds
    return Outcome(
        meals=table.meals,
        deadlock=bool(dl),
        deadlock_round=dl[0] if dl else None,
        rounds_played=table.round if played else 0,
        turns=table.turns,
    )


def _turn_text(t: dict) -> str:
    return (
        f"round {t['round']} philosopher {t['philosopher']} {t['action'] or 'null'} "
        f"ok={t['ok']} reason={t['reason']}"
    )
