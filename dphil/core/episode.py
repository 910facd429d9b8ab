"""Playing one episode with a scripted policy, and replaying a recorded one.

Replay is how `dphil-score` trusts nothing it reads: the recorded actions are
played through the same table, and the turns, meals and deadlock it produces
must equal the recorded ones.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import orjson

from dphil.core.conflicts import Resolver, lowest_id, random_resolver
from dphil.core.policies import Policy
from dphil.core.protocols import IDLE_ACTIONS
from dphil.core.records import EpisodeConfig, episode_record
from dphil.core.table import Table
from dphil.io.errors import DataError
from dphil.io.jsonl import dumps

# The policy's random stream is kept apart from the table's conflict coin so
# that changing a policy never changes how conflicts fall for the same seed.
_POLICY_STREAM = 0x5EED_0F_D1


def new_table(config: EpisodeConfig, resolve: Resolver | None = None) -> Table:
    """A fresh table for `config`, with its seeded conflict resolver."""
    if resolve is None:
        resolve = lowest_id if config.conflict == "lowest-id" else random_resolver(config.seed)
    return Table(
        config.n,
        config.rounds,
        protocol=config.protocol,
        deadlock_mode=config.deadlock_mode,
        resolve=resolve,
    )


def play(config: EpisodeConfig, policy: Policy) -> dict[str, Any]:
    """Play one whole episode with a scripted policy and return its record."""
    return _play(config, policy, copy=True)


def play_line(config: EpisodeConfig, policy: Policy) -> bytes:
    """The same episode as `play`, as one JSON line: what `dphil-rollout` writes.

    The record never leaves this function, so its turns can be the table's
    shared turn dicts instead of copies.
    """
    return dumps(_play(config, policy, copy=False))


def _play(config: EpisodeConfig, policy: Policy, *, copy: bool) -> dict[str, Any]:
    table = new_table(config)
    # Seeding a generator costs more than a whole round, so only policies that draw get one.
    rng = random.Random(config.seed ^ _POLICY_STREAM) if getattr(policy, "uses_rng", False) else None
    n = config.n
    philosophers = range(n)
    if config.schedule == "simultaneous":
        while not table.over:
            table.play_simultaneous([policy(table, i, rng) for i in philosophers], copy=copy)
    else:
        while not table.over:
            for i in philosophers:
                table.act(i, policy(table, i, rng))
            table.end_round()
    return episode_record(config, table)


def action_counts(turns: list[dict], protocol: str) -> tuple[int, int, int]:
    """(null actions, idle actions, all turns): what the reward's idle term is made of."""
    actions = [t["action"] for t in turns]
    return actions.count(None), actions.count(IDLE_ACTIONS[protocol]), len(actions)


class Outcome(NamedTuple):
    """What replaying a record's turns produced: everything a reward is computed from.

    A named tuple, so that it is cheap to build and to use as a memo key.
    """

    meals: tuple[int, ...]
    deadlock: bool
    deadlock_round: int | None
    rounds_played: int
    counts: tuple[int, int, int]  # (null, idle, all) actions, for the reward's idle term


_CACHE_SIZE = 4096
_cache: dict[tuple, Outcome] = {}
# Per model: [lookups, hits] since the memo was last judged for it. Random
# policies never repeat an episode, and a lookup costs about a fifth of a
# replay, so a model whose hit rate stays under _MIN_HIT_RATE is replayed
# directly, and looked at again every _REJUDGE records.
_JUDGE_AFTER = 256
_REJUDGE = 4096
_MIN_HIT_RATE = 0.1
_usage: dict[str, list[int]] = {}


def clear_memo() -> None:
    """Forget every memoised replay (benchmarks start cold, as a fresh process does)."""
    _cache.clear()
    _usage.clear()


def replay(record: dict[str, Any]) -> Outcome:
    """Replay a record's turns and check them; memoised on everything the outcome depends on.

    Replay is a pure function of the table configuration and the recorded
    turns, and scripted or degenerate runs repeat the same turn sequences many
    times, so identical episodes are checked once. The key holds every field
    the check reads, the turns as their JSON bytes (so `ok: 1` never matches
    `ok: true`).
    """
    turns = record.get("turns")
    if not turns or type(turns[0]) is not dict or len(turns[0]) != 5:
        # Model runs carry replies and usage in their turns: such records never repeat.
        return _replay(record)
    model = record.get("model")
    usage = _usage.get(model) if type(model) is str else None
    if usage is None:
        if len(_usage) >= _CACHE_SIZE:  # a stream of ever new model names: start the judging afresh
            _usage.clear()
        usage = _usage.setdefault(model if type(model) is str else "", [0, 0])
    lookups = usage[0] = usage[0] + 1
    if lookups > _JUDGE_AFTER and usage[1] < _MIN_HIT_RATE * lookups:
        if lookups >= _REJUDGE:
            usage[0] = usage[1] = 0
        return _replay(record)
    try:
        key = (
            record["n"],
            record["rounds"],
            record["protocol"],
            record["schedule"],
            record.get("conflict"),
            record.get("deadlock_mode", "terminal"),
            orjson.dumps(turns),  # canonical enough: equal bytes mean equal turns, types included
        )
        cached = _cache.get(key)
    except (KeyError, TypeError, orjson.JSONEncodeError):  # malformed: let the full replay say what is wrong
        return _replay(record)
    if cached is None:
        cached = _replay(record)
        if len(_cache) >= _CACHE_SIZE:
            _cache.clear()
        _cache[key] = cached
    else:
        usage[1] += 1
    return cached


class _Recheck(Exception):
    """The quick pass met something it does not explain; the careful pass will."""


def _replay(record: dict[str, Any]) -> Outcome:
    """Replay a record's turns through the table and check they are what the table does.

    Every round must hold exactly one turn per philosopher, in the order the
    table applies them. Contested forks under `conflict: random` are given to
    whichever contender the record says won; everything else (failures,
    meals, deadlock, when the episode ends) must follow from the rules.
    Raises DataError on the first disagreement.

    A quick pass checks whole rounds at once; only when it finds anything
    amiss does a careful pass run, turn by turn, to say exactly what.
    """
    try:
        return _quick_pass(record)
    except (_Recheck, DataError, KeyError, TypeError, IndexError, ValueError):
        return _careful_pass(record)


def recorded_winner(record: dict[str, Any], round_turns: list) -> Resolver:
    """How a replay settles a contested fork: lowest-id, or whoever the round's turns say got it."""
    if record.get("conflict") == "lowest-id":
        return lowest_id

    def resolve(rnd: int, fork: int, a: int, b: int) -> int:
        won = {t["philosopher"]: t["ok"] for t in round_turns}
        if won.get(a) == won.get(b):
            raise DataError(
                f"round {rnd}: philosophers {a} and {b} both reached for fork {fork} "
                "but the record does not say exactly one of them got it"
            )
        return a if won.get(a) else b

    return resolve


def _quick_pass(record: dict[str, Any]) -> Outcome:
    """Replay whole rounds, comparing each with the recorded one in a single list comparison."""
    n = record["n"]
    turns = record["turns"]
    total = len(turns)
    if not total or total % n:
        raise _Recheck
    chunk: list = []
    table = Table(
        n,
        record["rounds"],
        protocol=record["protocol"],
        deadlock_mode=record.get("deadlock_mode", "terminal"),
        resolve=recorded_winner(record, chunk),
    )
    play_round = table.resolve_round if record["schedule"] == "simultaneous" else table.resolve_sequential_round
    end_round = table.end_round
    played: list = []
    for k in range(0, total, n):
        if table.over:
            raise _Recheck
        chunk[:] = turns[k : k + n]
        actions: list = [None] * n
        for t in chunk:
            actions[t["philosopher"]] = t["action"]
        got = play_round(actions, copy=False)
        played += actions
        # A scripted record's round compares whole in C; a model's turns also carry replies and usage.
        if chunk != got and not all(
            w == g
            or (
                w["round"] == g["round"]
                and w["philosopher"] == g["philosopher"]
                and w["ok"] is g["ok"]
                and w["reason"] == g["reason"]
            )
            for w, g in zip(chunk, got, strict=True)
        ):
            raise _Recheck
        end_round()
    if not table.over:
        raise _Recheck
    return _outcome(table, (played.count(None), played.count(IDLE_ACTIONS[record["protocol"]]), total))


def _careful_pass(record: dict[str, Any]) -> Outcome:
    """Replay turn by turn and raise DataError saying exactly where the record departs from the table."""
    n, rounds = record["n"], record["rounds"]
    turns = record["turns"]
    chunk: list = []
    try:
        table = Table(
            n,
            rounds,
            protocol=record["protocol"],
            deadlock_mode=record.get("deadlock_mode", "terminal"),
            resolve=recorded_winner(record, chunk),
        )
    except ValueError as e:
        raise DataError(str(e)) from None
    simultaneous = record["schedule"] == "simultaneous"
    total = len(turns)
    k = 0
    while k < total:
        r = table.round
        if table.over:
            raise DataError(f"the episode ended at round {r} but turns[{k}] continues it")
        chunk[:] = turns[k : k + n]
        actions: list = [None] * n
        seen = 0
        for j, t in enumerate(chunk, k):
            try:
                i = t["philosopher"]
                if t["round"] != r:
                    raise DataError(
                        f"turns[{j}] is in round {t['round']!r}; expected round {r} "
                        f"(each round has one turn per philosopher)"
                    )
                if not 0 <= i < n or type(i) is not int:
                    raise DataError(f"turns[{j}] has philosopher {i!r} outside the table of {n}")
                actions[i] = t["action"]
            except KeyError as e:
                raise DataError(f"turns[{j}] is missing field {e.args[0]!r}") from None
            except TypeError:
                raise DataError(f"turns[{j}] should be an object with integer round and philosopher") from None
            if seen >> i & 1:
                raise DataError(f"philosopher {i} acts twice in round {r}")
            seen |= 1 << i
        if len(chunk) < n:
            missing = [i for i in range(n) if not seen >> i & 1]
            raise DataError(f"round {r}: no turn for philosopher(s) {missing}")
        try:
            got_turns = (table.resolve_round if simultaneous else table.resolve_sequential_round)(actions)
        except ValueError as e:
            raise DataError(f"round {r}: {e}") from None
        for j, (want, got) in enumerate(zip(chunk, got_turns, strict=True), k):
            if want == got:
                continue
            try:
                same = (
                    want["philosopher"] == got["philosopher"]
                    and want["ok"] is got["ok"]
                    and want["reason"] == got["reason"]
                )
            except KeyError as e:
                raise DataError(f"turns[{j}] is missing field {e.args[0]!r}") from None
            if not same:
                raise DataError(
                    f"turns[{j}] disagrees with the table: recorded {_turn_text(want)}, replay gives {_turn_text(got)}"
                )
        table.end_round()
        k += n
    if total and not table.over:
        raise DataError(f"the record stops after round {table.round - 1} of {rounds} with no deadlock to end it")
    return _outcome(table, action_counts(turns, record["protocol"]))


def _outcome(table: Table, counts: tuple[int, int, int]) -> Outcome:
    dl = table.deadlock_rounds
    return Outcome(
        meals=tuple(table.meals),
        deadlock=bool(dl),
        deadlock_round=dl[0] if dl else None,
        rounds_played=table.round if counts[2] else 0,
        counts=counts,
    )


def _turn_text(t: dict) -> str:
    return (
        f"round {t.get('round')} philosopher {t.get('philosopher')} {t.get('action') or 'null'} "
        f"ok={t.get('ok')} reason={t.get('reason')}"
    )
