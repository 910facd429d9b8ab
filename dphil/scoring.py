"""Scoring one episode record: check its outcome against its own turns, then attach the reward.

Re-scoring is idempotent: `reward` and `metrics` are replaced, never stacked,
so old logs can be rescored under any variant and weights.
"""

from __future__ import annotations

from typing import Any

from .episode import replay
from .errors import DataError
from .records import check_episode
from .reward import RewardSpec, action_counts, score


def score_record(record: dict[str, Any], spec: RewardSpec, *, trust_outcome: bool = False) -> dict[str, Any]:
    """Return `record` with `reward` and `metrics` set (both null for errored episodes)."""
    check_episode(record)
    if record["status"] == "error":
        record["reward"] = None
        record["metrics"] = None
        return record
    if trust_outcome:
        meals, deadlock, deadlock_round, rounds_played = _recorded_outcome(record)
        for k, t in enumerate(record["turns"]):
            if not isinstance(t, dict) or "action" not in t:
                raise DataError(f"turns[{k}] is missing field 'action'")
        counts = action_counts(record["turns"], record["protocol"])
    else:
        if not record["turns"]:
            raise DataError("a complete episode has no turns")
        outcome = replay(record)
        meals, deadlock = list(outcome.meals), outcome.deadlock
        deadlock_round, rounds_played = outcome.deadlock_round, outcome.rounds_played
        _agree(record, "meals", meals)
        _agree(record, "deadlock", deadlock)
        _agree(record, "deadlock_round", deadlock_round)
        _agree(record, "rounds_played", rounds_played)
        counts = outcome.counts
    reward, metrics = score(
        spec,
        protocol=record["protocol"],
        n=record["n"],
        rounds=record["rounds"],
        meals=meals,
        deadlock=deadlock,
        deadlock_round=deadlock_round,
        rounds_played=rounds_played,
        counts=counts,
    )
    record["reward"] = reward
    record["metrics"] = metrics
    return record


def _agree(record: dict[str, Any], name: str, replayed: Any) -> None:
    if name not in record:
        raise DataError(f"missing field {name!r}")
    recorded = record[name]
    if recorded != replayed or type(recorded) is not type(replayed):
        raise DataError(
            f"recorded {name} {_show(recorded)} disagrees with its own turns, which give "
            f"{_show(replayed)} (use --trust-outcome to score the recorded outcome anyway)"
        )


def _recorded_outcome(record: dict[str, Any]) -> tuple[list[int], bool, int | None, int]:
    for name in ("meals", "deadlock", "deadlock_round", "rounds_played"):
        if name not in record:
            raise DataError(f"missing field {name!r}")
    meals = record["meals"]
    if len(meals) != record["n"] or any(type(m) is not int or m < 0 for m in meals):
        raise DataError(f"field 'meals' should be {record['n']} non-negative integers")
    if type(record["deadlock"]) is not bool:
        raise DataError("field 'deadlock' should be a boolean")
    dr = record["deadlock_round"]
    if dr is not None and type(dr) is not int:
        raise DataError("field 'deadlock_round' should be an integer or null")
    rp = record["rounds_played"]
    if type(rp) is not int or rp < 0:
        raise DataError("field 'rounds_played' should be a non-negative integer")
    return meals, record["deadlock"], dr, rp


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
