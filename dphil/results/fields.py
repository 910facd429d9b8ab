"""The episode fields the results read, their types, and the names a --by field may take.

Polars parses each source with the explicit schema `_RAW`, which names only the fields
statistics need (turns as just their `action` and `ok`), so nothing else is materialised.
`_KNOWN` types the contract fields a --by may name, `_DERIVED` is the row each episode
becomes, and `_RESERVED` holds the names the cell and comparison records use themselves,
which no grouping field may take (`parse_by`, `check_fields`).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from dphil.io.errors import UsageError

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
    "status": pl.String(),
    "seed": pl.String(),
    "deadlock": pl.Boolean(),
    "meals": pl.List(pl.Int64()),
    "reward": pl.Struct({"variant": pl.String(), "total": pl.Float64()}),
    "metrics": pl.Struct(
        {
            "throughput_per_round": pl.Float64(),
            "gini_fairness": pl.Float64(),
            "starvation": pl.Int64(),
            "time_to_deadlock": pl.Int64(),
        }
    ),
    "turns": pl.List(pl.Struct({"action": pl.String(), "ok": pl.Boolean()})),
    "usage": pl.Struct({"prompt_tokens": pl.Int64(), "completion_tokens": pl.Int64(), "cost": pl.Float64()}),
}

# One row per episode after reading: the grouping fields plus these.
_DERIVED: dict[str, pl.DataType] = {
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


def check_present(frame: pl.DataFrame, names: Sequence[str]) -> None:
    """A --by or --compare field that no episode has is a typo, not a group: exit 64 naming it.

    Contract fields (`_KNOWN`) are exempt: `deadlock_round` is null in every episode of a
    table that never deadlocked, and that is a group."""
    for f in dict.fromkeys(names):
        if f not in _KNOWN and f in frame.columns and frame.height and frame[f].null_count() == frame.height:
            raise UsageError(
                f"no episode has a field {f!r}: group by record fields such as "
                f"{', '.join(DEFAULT_BY)}, protocol, run, checkpoint_step, or a --tag key"
            )
