"""Scoring one episode record: check its outcome against its own turns, then attach the reward.

Re-scoring is idempotent: `reward` and `metrics` are replaced, never stacked,
so old logs can be rescored under any variant and weights.
"""

from __future__ import annotations

from typing import Any

import orjson

from dphil.core.episode import Outcome, replay
from dphil.core.records import check_episode, check_number
from dphil.io.errors import DataError
from dphil.scoring.consistency import has_talk, message_consistency
from dphil.scoring.reward import RewardSpec, action_counts, score


def score_record(record: dict[str, Any], spec: RewardSpec, *, trust_outcome: bool = False) -> dict[str, Any]:
    """Return `record` with `reward` and `metrics` set (both null for errored episodes)."""
    check_episode(record)
    if record["status"] == "error":
        record["reward"] = None
        record["metrics"] = None
        return record
    record["reward"], record["metrics"] = _score(spec, record, outcome_of(record, trust_outcome=trust_outcome))
    return record


class Scorer:
    """Score a stream of JSON lines the way `dphil-score` does, one output line per input line.

    The result is the line `score_record` would give, but built without
    re-serialising the record: the input line is kept byte for byte and the
    reward and metrics are appended to it (records that already carry either
    are re-serialised whole, so rescoring replaces them). Outcomes repeat far
    more than episodes do, so the appended bytes are memoised per outcome.
    A line that repeats a field keeps both copies as written; what was checked
    and scored is the last one, which is what orjson and Python's json read.
    """

    _MAX_CACHED = 4096

    def __init__(self, spec: RewardSpec, *, trust_outcome: bool = False) -> None:
        self.spec = spec
        self.trust_outcome = trust_outcome
        self._tails: dict[tuple, bytes] = {}

    def line(self, record: dict[str, Any], raw: bytes) -> bytes:
        """The scored line for `record`, which was parsed from the JSON line `raw`."""
        check_episode(record)
        if "reward" in record or "metrics" in record:
            return orjson.dumps(
                score_record(record, self.spec, trust_outcome=self.trust_outcome), option=orjson.OPT_APPEND_NEWLINE
            )
        if record["status"] == "error":
            tail = b',"reward":null,"metrics":null}\n'
        else:
            outcome = outcome_of(record, trust_outcome=self.trust_outcome)
            # Talk makes the metrics depend on more than the outcome: such records are not cached.
            key = (record["protocol"], record["n"], record["rounds"], outcome)
            tail = None if has_talk(record) else self._tails.get(key)  # type: ignore[assignment]
            if tail is None:
                reward, metrics = _score(self.spec, record, outcome)
                tail = b',"reward":' + orjson.dumps(reward) + b',"metrics":' + orjson.dumps(metrics) + b"}\n"
                if len(self._tails) >= self._MAX_CACHED:
                    self._tails.clear()
                if not has_talk(record):
                    self._tails[key] = tail
        # A parsed object line ends in `}` and JSON whitespace; the reward goes before the brace.
        return raw.rstrip()[:-1] + tail


def outcome_of(record: dict[str, Any], *, trust_outcome: bool = False) -> Outcome:
    """What the reward is computed from: replayed from the turns (and checked), or as recorded."""
    if trust_outcome:
        meals, deadlock, deadlock_round, rounds_played = _recorded_outcome(record)
        for k, t in enumerate(record["turns"]):
            if not isinstance(t, dict) or "action" not in t:
                raise DataError(f"turns[{k}] is missing field 'action'")
        return Outcome(
            tuple(meals), deadlock, deadlock_round, rounds_played, action_counts(record["turns"], record["protocol"])
        )
    if not record["turns"]:
        raise DataError("a complete episode has no turns")
    replayed = replay(record)
    try:  # the common case in one comparison; anything off is explained field by field
        if (
            record["deadlock"] is replayed.deadlock
            and record["rounds_played"] == replayed.rounds_played
            and record["deadlock_round"] == replayed.deadlock_round
            and tuple(record["meals"]) == replayed.meals
            and type(record["rounds_played"]) is int
            and type(record["deadlock_round"]) is type(replayed.deadlock_round)
        ):
            return replayed
    except (KeyError, TypeError):
        pass
    _agree(record, "meals", list(replayed.meals))
    _agree(record, "deadlock", replayed.deadlock)
    _agree(record, "deadlock_round", replayed.deadlock_round)
    _agree(record, "rounds_played", replayed.rounds_played)
    return replayed


def _score(spec: RewardSpec, record: dict[str, Any], outcome: Outcome) -> tuple[dict, dict]:
    meals, deadlock, deadlock_round, rounds_played, counts = outcome
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
    try:  # what dphil-score writes, every reader must accept (the bound is in dphil.core.records)
        check_number(reward["total"], "reward.total")
    except DataError as e:
        raise DataError(f"{e.reason}: the reward weights give a total no reader accepts") from None
    if has_talk(record):
        metrics = {**metrics, "message_consistency": message_consistency(record["turns"], record["protocol"])}
    return reward, metrics


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
