"""Cells: one `kind: "cell"` record per value of the --by fields, summarising its episodes.

The numbers come from the running totals kept while reading (`dphil.results.tally`), not from
the episodes themselves. A cell's reward mean has a Student t interval and its deadlock rate
a Wilson interval (`dphil.core.maths`); errored episodes are counted, never averaged, and a
cell whose episodes are mostly degenerate (no deadlock and no meals) is warned about.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dphil.core import maths as stats
from dphil.core.records import SCHEMA_VERSION
from dphil.io.errors import DataError
from dphil.results.fields import DEGENERATE_WARN
from dphil.results.frame import Episodes, Warn, _silent


def cell_records(
    episodes: Episodes,
    by: Sequence[str],
    *,
    degenerate_warn: float = DEGENERATE_WARN,
    warn: Warn = _silent,
    confidence: float = stats.CONFIDENCE,
) -> list[dict[str, Any]]:
    """One `kind: "cell"` record per value of the `by` fields, in sorted order."""
    if episodes.count == 0:
        return []
    by = list(by)
    summary = episodes.cells(by).sort(by, nulls_last=True)
    records = []
    for row in summary.iter_rows(named=True):
        group = {f: row[f] for f in by}
        label = _label(group)
        if len(row["variants"]) > 1:
            raise DataError(
                f"cell {label} mixes reward variants {' and '.join(row['variants'])}: "
                "score all episodes the same way (dphil-score) before comparing them"
            )
        n = row["episodes"]
        errors = row["errors"]
        ci = stats.mean_ci_from(n, row["reward_mean"], row["reward_std"], confidence)
        dl = row["deadlocks"] if n else None
        wil = stats.wilson(row["deadlocks"], n, confidence) if n else None
        record: dict[str, Any] = {
            "kind": "cell",
            "schema_version": SCHEMA_VERSION,
            **group,
            "episodes": n,
            "errors": errors,
            "reward_variant": row["variants"][0] if row["variants"] else None,
            "reward_mean": ci.mean,
            "reward_std": ci.sd,
            "reward_ci": _pair(ci.lo, ci.hi),
            "deadlocks": dl,
            "deadlock_rate": _rate(dl, n),
            "deadlock_ci": list(wil) if wil else None,
            "meals_mean": row["meals_mean"],
            "zero_meal_rate": _rate(row["zero_meals"], n),
            "degenerate_rate": _rate(row["degenerate"], n),
            "throughput_mean": row["throughput_mean"],
            "gini_fairness_mean": row["gini_fairness_mean"],
            "starvation_mean": row["starvation_mean"],
            "time_to_deadlock_mean": row["time_to_deadlock_mean"],
            "message_consistency_mean": row["message_consistency_mean"],
            "message_consistency_episodes": row["message_consistency_episodes"],
            "null_action_rate": _rate(row["null"], row["turns"]),
            "failed_action_rate": _rate(row["failed"], row["acted"]),
            "turns": row["turns"] or 0,
            "prompt_tokens": row["prompt_tokens"] or 0,
            "completion_tokens": row["completion_tokens"] or 0,
            "cost": row["cost"] or 0.0,
        }
        records.append(record)
        if errors:
            warn(f"{label}: {errors} errored episode(s) left out of every statistic")
        if n == 0:
            warn(f"{label}: no complete episodes, nothing to summarise")
        elif record["degenerate_rate"] >= degenerate_warn:
            warn(
                f"{label}: {row['degenerate']} of {n} episodes are degenerate (no deadlock and "
                "no meals): their no-deadlock reward measures inaction, not coordination"
            )
    return records


def _label(group: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in group.items()) or "all episodes"


def _rate(k: int | None, n: int | None) -> float | None:
    return k / n if n and k is not None else None


def _pair(lo: float | None, hi: float | None) -> list[float] | None:
    return None if lo is None or hi is None else [lo, hi]
