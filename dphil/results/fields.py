"""The episode fields the results read, their types, and the names a --by field may take.

Polars parses each chunk of a source with the explicit schema `_RAW`, which names only the
fields statistics need (turns as just their `action` and `ok`), so nothing else is
materialised. `_KNOWN` types the contract fields a --by may name, `_DERIVED` is the row each
episode becomes before it is added to the running totals (`derived_row` makes it from one
record read line by line, with the checks of `dphil.core.records`), and `_RESERVED` holds the
names the cell and comparison records use themselves, which no grouping field may take
(`parse_by`, `check_fields`). `Compare` is one `--compare FIELD A B`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from dphil.core.records import check_number, check_schema_version, check_seed, checked_outcome, is_int
from dphil.io.errors import DataError, UsageError

DEFAULT_BY = ("model", "n")

# Contract fields with a known type; any other --by field is read as text and given a
# number type afterwards when every value is one (e.g. checkpoint_step).
_KNOWN: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "rounds": pl.Int64(),
    "protocol": pl.String(),
    "schedule": pl.String(),
    "conflict": pl.String(),
    "deadlock_mode": pl.String(),
    "episode_id": pl.String(),
    "dphil_version": pl.String(),
    "kind": pl.String(),
    "status": pl.String(),
    "deadlock": pl.Boolean(),
    "schema_version": pl.Int64(),
    "deadlock_round": pl.Int64(),
    "rounds_played": pl.Int64(),
}
_OBJECTS = ("reward", "metrics", "turns", "meals", "usage", "events", "deadlock_rounds")

_RAW: dict[str, pl.DataType] = {
    "kind": pl.String(),
    "schema_version": pl.Int64(),
    "episode_id": pl.String(),
    "status": pl.String(),
    # Int64: a seed written as 1.0, "1" or 2**64 fails polars, and the line-by-line reading
    # says why; int64 seeds beyond 2**63 (uint64, which orjson writes) are read that way too.
    "seed": pl.Int64(),
    "deadlock": pl.Boolean(),
    "meals": pl.List(pl.Int64()),
    "reward": pl.Struct({"variant": pl.String(), "total": pl.Float64()}),
    "metrics": pl.Struct(
        {
            "throughput_per_round": pl.Float64(),
            "gini_fairness": pl.Float64(),
            "starvation": pl.Int64(),
            "time_to_deadlock": pl.Int64(),
            # Only episodes played with --talk have it (dphil-score); null when no intention was stated.
            "message_consistency": pl.Float64(),
        }
    ),
    "turns": pl.List(pl.Struct({"action": pl.String(), "ok": pl.Boolean()})),
    "usage": pl.Struct({"prompt_tokens": pl.Int64(), "completion_tokens": pl.Int64(), "cost": pl.Float64()}),
}

# One row per episode after reading: the grouping fields plus these.
_DERIVED: dict[str, pl.DataType] = {
    "_id": pl.String(),
    "_error": pl.Boolean(),
    "_seed": pl.String(),
    "_reward": pl.Float64(),
    "_variant": pl.String(),
    "_deadlock": pl.Boolean(),
    "_meals": pl.Int64(),
    "_throughput": pl.Float64(),
    "_gini": pl.Float64(),
    "_starvation": pl.Int64(),
    "_ttd": pl.Int64(),
    "_consistency": pl.Float64(),
    "_turns": pl.Int64(),
    "_null": pl.Int64(),
    "_acted": pl.Int64(),
    "_failed": pl.Int64(),
    "_prompt_tokens": pl.Int64(),
    "_completion_tokens": pl.Int64(),
    "_cost": pl.Float64(),
}

# Names a cell or comparison record uses itself; a grouping field may not take them.
_RESERVED = frozenset(
    {
        "kind",
        "schema_version",
        "episodes",
        "errors",
        "reward_variant",
        "reward_mean",
        "reward_std",
        "reward_ci",
        "deadlocks",
        "deadlock_rate",
        "deadlock_ci",
        "meals_mean",
        "zero_meal_rate",
        "degenerate_rate",
        "throughput_mean",
        "gini_fairness_mean",
        "starvation_mean",
        "time_to_deadlock_mean",
        "message_consistency_mean",
        "message_consistency_episodes",
        "null_action_rate",
        "failed_action_rate",
        "turns",
        "prompt_tokens",
        "completion_tokens",
        "cost",
        "field",
        "a",
        "b",
        "diff",
        "diff_ci",
        "welch_t",
        "df",
        "p_value",
        "p_adjusted",
        "adjust",
        "hedges_g",
        "hedges_g_ci",
        "deadlock",
        "paired",
        "paired_tests",
        "power",
        "notes",
    }
)

# Warn when at least this share of a cell's episodes is degenerate (no deadlock and no meals).
DEGENERATE_WARN = 0.25


@dataclass(frozen=True)
class Compare:
    """`--compare FIELD A B`: B against A, within each group of the other --by fields."""

    field: str
    a: str
    b: str


def parse_by(text: str) -> list[str]:
    """`model,n` -> ["model", "n"], refusing names the records cannot be grouped by."""
    fields = [f.strip() for f in text.split(",") if f.strip()]
    if not fields:
        raise UsageError("--by needs at least one field name")
    check_fields(fields)
    if len(set(fields)) != len(fields):
        raise UsageError(f"--by names a field twice: {text}")
    return fields


def check_fields(fields: Sequence[str]) -> None:
    for f in fields:
        if f in _OBJECTS:
            raise UsageError(f"cannot group by {f!r}: it is not a single value per episode")
        if f in _RESERVED or f.startswith("_"):
            raise UsageError(f"cannot group by {f!r}: the name is taken by the output records")


def check_present(present: Collection[str], episodes: int, names: Sequence[str], *, option: str = "--by") -> None:
    """A field that no episode has is a typo, not a group: exit 64 naming it and the option that named it.

    `present` holds the fields some episode had a value for. Contract fields (`_KNOWN`) are
    exempt: `deadlock_round` is null in every episode of a table that never deadlocked, and
    that is a group."""
    for f in dict.fromkeys(names):
        if f not in _KNOWN and episodes and f not in present:
            if option == "--cluster":
                hint = "cluster by a field that tells training runs apart, such as run, or a --tag key"
            else:
                known = ", ".join(DEFAULT_BY)
                hint = f"group by record fields such as {known}, protocol, run, checkpoint_step, or a --tag key"
            raise UsageError(f"no episode has a field {f!r} ({option}): {hint}")


# -- one record's row, read line by line ------------------------------------------------


def derived_row(record: dict[str, Any], fields: Sequence[str]) -> list[Any]:
    """The `_DERIVED` row of one record after its `fields`, or DataError saying what is wrong with it.

    What polars reads a chunk into, for one record read line by line (`frame._load_slowly`)."""
    kind = record.get("kind", "episode")
    if kind != "episode":
        raise DataError(f"expected a scored episode, got a record of kind {kind!r}")
    status = record.get("status")
    if status not in ("complete", "error"):
        if "status" not in record:
            raise DataError("missing field 'status'")
        raise DataError(f"field 'status' should be 'complete' or 'error', got {status!r}")
    check_schema_version(record)
    values: list[Any] = [_field(record, f) for f in fields]
    seed = record.get("seed")
    if seed is not None:
        check_seed(seed)
    episode_id = record.get("episode_id")
    if isinstance(episode_id, dict | list):
        raise DataError("field 'episode_id' should be a string")
    values.append(_text(episode_id))
    values.append(status == "error")
    values.append(None if seed is None else str(seed))
    usage = _usage(record.get("usage"))
    if status == "error":
        return [*values, *([None] * 13), *usage]
    reward = record.get("reward")
    if not isinstance(reward, dict):
        raise DataError("episode is not scored (no 'reward' object): run dphil-score first")
    total = check_number(reward.get("total"), "reward.total")
    variant = reward.get("variant")
    meals, deadlock = checked_outcome(record)
    turns = record.get("turns")
    if not isinstance(turns, list):
        raise DataError("field 'turns' should be a list")
    n_null = n_failed = 0
    for k, t in enumerate(turns):
        if not isinstance(t, dict) or not isinstance(t.get("ok"), bool):
            raise DataError(f"turns[{k}] should be an object with a boolean 'ok'")
        action = t.get("action")
        if action is None:
            n_null += 1
        elif not isinstance(action, str):
            raise DataError(f"turns[{k}].action should be a string or null")
        elif not t["ok"]:
            n_failed += 1
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        raise DataError("episode is not scored (no 'metrics' object): run dphil-score first")
    throughput = check_number(metrics.get("throughput_per_round"), "metrics.throughput_per_round")
    gini = check_number(metrics.get("gini_fairness"), "metrics.gini_fairness")
    if not is_int(metrics.get("starvation")):
        raise DataError("field 'metrics.starvation' should be a number")
    ttd = metrics.get("time_to_deadlock")
    if ttd is not None and not is_int(ttd):
        raise DataError("field 'metrics.time_to_deadlock' should be an integer or null")
    consistency = metrics.get("message_consistency")
    if consistency is not None and (
        isinstance(consistency, bool) or not isinstance(consistency, int | float) or not 0 <= consistency <= 1
    ):
        raise DataError("field 'metrics.message_consistency' should be a number from 0 to 1, or null")
    return [
        *values,
        total,
        variant if isinstance(variant, str) else None,
        deadlock,
        sum(meals),
        throughput,
        gini,
        metrics["starvation"],
        ttd,
        consistency,
        len(turns),
        n_null,
        len(turns) - n_null,
        n_failed,
        *usage,
    ]


def _field(record: dict[str, Any], name: str) -> Any:
    value = record.get(name)
    if isinstance(value, dict | list):
        raise DataError(
            f"field {name!r} is an {'object' if isinstance(value, dict) else 'array'}; "
            "--by and --compare need a single value"
        )
    known = _KNOWN.get(name)
    if known is None or isinstance(known, pl.String):
        # Text, as polars reads it; free fields get their type once every chunk is read.
        return _text(value)
    if value is None:
        return None
    if isinstance(known, pl.Boolean):
        if not isinstance(value, bool):
            raise DataError(f"field {name!r} should be true or false")
        return value
    if not is_int(value):
        raise DataError(f"field {name!r} should be an integer")
    return value


def _text(value: Any) -> str | None:
    """A scalar JSON value as polars reads it into a text column."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _usage(usage: Any) -> list[Any]:
    if usage is None:
        return [0, 0, 0.0]
    if not isinstance(usage, dict):
        raise DataError("field 'usage' should be an object")
    out: list[Any] = []
    for name in ("prompt_tokens", "completion_tokens"):
        value = usage.get(name)
        if value is not None and not is_int(value):
            raise DataError(f"field 'usage.{name}' should be a number")
        out.append(value if value is not None else 0)
    cost = usage.get("cost")
    out.append(0.0 if cost is None else check_number(cost, "usage.cost"))
    return out
