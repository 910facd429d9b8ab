"""Comparisons: `--compare FIELD A B`, B against A within each group of the other --by fields.

Each comparison record carries Welch's t, Hedges' g, the two-proportion test of the
deadlock rates and, where the arms share seeds, the paired tests; p values are adjusted
for multiplicity across every comparison of the run, one family per test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from dphil.core import maths as stats
from dphil.core.records import SCHEMA_VERSION
from dphil.io.errors import UsageError
from dphil.results.cells import _label, _pair, _rate
from dphil.results.frame import Episodes, Warn, _silent


@dataclass(frozen=True)
class Compare:
    """`--compare FIELD A B`: B against A, within each group of the other --by fields."""

    field: str
    a: str
    b: str


def comparison_records(
    episodes: Episodes,
    by: Sequence[str],
    compares: Sequence[Compare],
    *,
    adjust: str = "holm",
    power: bool = False,
    effect: float | None = None,
    warn: Warn = _silent,
    confidence: float = stats.CONFIDENCE,
) -> list[dict[str, Any]]:
    """One `kind: "comparison"` record per --compare and group of the other `by` fields,
    with p values adjusted for multiplicity across all of them (per test)."""
    if adjust not in stats.ADJUSTMENTS:
        raise UsageError(f"unknown --adjust {adjust!r}")
    frame = episodes.frame
    records: list[dict[str, Any]] = []
    for comp in compares:
        if comp.a == comp.b:
            raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: A and B are the same")
        if comp.field not in frame.columns:
            raise UsageError(f"--compare {comp.field}: the field was not read")
        text = pl.col(comp.field).cast(pl.String)
        arms = frame.filter(text.is_in([comp.a, comp.b])).with_columns((text == comp.b).alias("_is_b"))
        for value in (comp.a, comp.b):
            if arms.filter(text == value).height == 0:
                raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: no episodes with {comp.field} = {value!r}")
        rest = [f for f in by if f != comp.field]
        if rest:
            parts = arms.sort(rest, nulls_last=True).partition_by(rest, as_dict=True, maintain_order=True)
        else:
            parts = {(): arms}
        for key, part in parts.items():
            group = dict(zip(rest, key, strict=True))
            a, b = part.filter(~pl.col("_is_b")), part.filter(pl.col("_is_b"))
            if a.height == 0 or b.height == 0:
                missing = comp.a if a.height == 0 else comp.b
                warn(f"{_label(group)}: no episodes with {comp.field} = {missing!r}; comparison skipped")
                continue
            records.append(_compare(comp, group, a, b, power=power, effect=effect, confidence=confidence))
    _adjust_all(records, adjust)
    return records


def _compare(
    comp: Compare,
    group: dict[str, Any],
    a: pl.DataFrame,
    b: pl.DataFrame,
    *,
    power: bool,
    effect: float | None,
    confidence: float,
) -> dict[str, Any]:
    notes: list[str] = []
    a_ok, b_ok = a.filter(~pl.col("_error")), b.filter(~pl.col("_error"))
    ra, rb = a_ok["_reward"].to_numpy(), b_ok["_reward"].to_numpy()
    na, nb = len(ra), len(rb)
    ka, kb = int(a_ok["_deadlock"].sum()), int(b_ok["_deadlock"].sum())
    welch = stats.welch(ra, rb, confidence)
    g = stats.hedges_g(ra, rb, confidence)
    prop = stats.two_proportions(ka, na, kb, nb, confidence)
    if na < 2 or nb < 2:
        notes.append("an arm has fewer than 2 complete episodes: tests and effect size undefined")
    elif welch.t is None:
        notes.append("both arms have zero reward variance: t test and effect size undefined")
    elif g.g is None:
        notes.append("pooled reward SD is 0: effect size undefined")
    record: dict[str, Any] = {
        "kind": "comparison",
        "schema_version": SCHEMA_VERSION,
        **group,
        "field": comp.field,
        "a": _arm(a[comp.field][0], a, a_ok, ra, ka, confidence),
        "b": _arm(b[comp.field][0], b, b_ok, rb, kb, confidence),
        "diff": welch.diff,
        "diff_ci": _pair(welch.lo, welch.hi),
        "welch_t": welch.t,
        "df": welch.df,
        "p_value": welch.p_value,
        "p_adjusted": welch.p_value,
        "adjust": "none",
        "hedges_g": g.g,
        "hedges_g_ci": _pair(g.lo, g.hi),
        "deadlock": {
            "a_rate": _rate(ka, na),
            "b_rate": _rate(kb, nb),
            "diff": prop.diff,
            "diff_ci": _pair(prop.lo, prop.hi),
            "test": prop.test,
            "p_value": prop.p_value,
            "p_adjusted": prop.p_value,
        },
        "paired": False,
        "paired_tests": None,
    }
    pairs = _pairs(a_ok, b_ok, notes)
    if pairs is not None:
        pt = stats.paired(pairs["_reward"].to_numpy(), pairs["_reward_b"].to_numpy(), confidence)
        mc = stats.mcnemar(pairs["_deadlock"].to_numpy(), pairs["_deadlock_b"].to_numpy())
        record["paired"] = True
        record["paired_tests"] = {
            "pairs": pt.pairs,
            "diff": pt.diff,
            "diff_ci": _pair(pt.lo, pt.hi),
            "t": pt.t,
            "df": pt.df,
            "p_value": pt.p_value,
            "p_adjusted": pt.p_value,
            "wilcoxon_w": pt.wilcoxon_w,
            "wilcoxon_p": pt.wilcoxon_p,
            "wilcoxon_p_adjusted": pt.wilcoxon_p,
            "mcnemar": {
                "only_a": mc.only_a,
                "only_b": mc.only_b,
                "p_value": mc.p_value,
                "p_adjusted": mc.p_value,
            },
        }
        if pt.t is None and pt.pairs >= 2:
            notes.append("every paired difference is the same: paired t undefined")
    if power:
        record["power"] = _power(g.g, effect, na, nb, notes)
    record["notes"] = notes
    return record


def _arm(
    value: Any,
    all_rows: pl.DataFrame,
    ok: pl.DataFrame,
    rewards: Any,
    deadlocks: int,
    confidence: float,
) -> dict[str, Any]:
    ci = stats.mean_ci(rewards, confidence)
    return {
        "value": value,
        "episodes": ci.n,
        "errors": all_rows.height - ok.height,
        "reward_mean": ci.mean,
        "reward_std": ci.sd,
        "reward_ci": _pair(ci.lo, ci.hi),
        "deadlocks": deadlocks,
        "deadlock_rate": _rate(deadlocks, ci.n),
    }


def _pairs(a: pl.DataFrame, b: pl.DataFrame, notes: list[str]) -> pl.DataFrame | None:
    """Episodes matched by seed, when both arms use each seed at most once and share >= 2."""
    sa, sb = a["_seed"], b["_seed"]
    if sa.null_count() or sb.null_count():
        return None
    if sa.n_unique() != len(sa) or sb.n_unique() != len(sb):
        shared = set(sa.to_list()) & set(sb.to_list())
        if shared:
            notes.append("seeds repeat within an arm: episodes cannot be paired by seed")
        return None
    cols = ["_seed", "_reward", "_deadlock"]
    joined = a.select(cols).join(b.select(cols), on="_seed", how="inner", suffix="_b")
    if joined.height < 2:
        return None
    unmatched = len(sa) + len(sb) - 2 * joined.height
    if unmatched:
        notes.append(
            f"paired tests use the {joined.height} seeds found in both arms; "
            f"{unmatched} episode(s) without a partner are left out of them"
        )
    return joined.sort("_seed")


def _power(observed: float | None, effect: float | None, na: int, nb: int, notes: list[str]) -> dict[str, Any]:
    g = effect if effect is not None else observed
    block: dict[str, Any] = {
        "effect_g": g,
        "effect_source": "given" if effect is not None else "observed",
        "alpha": stats.ALPHA,
        "target_power": stats.POWER,
        "episodes_per_arm": stats.sample_size(g) if g is not None else None,
        "power_now": stats.power(g, na, nb) if g is not None else None,
        "detectable_g": stats.detectable_effect(na, nb),
    }
    if not g:
        notes.append("no effect size to plan for: give --effect G")
    return block


def _adjust_all(records: list[dict[str, Any]], method: str) -> None:
    """Adjust each test's p values across all comparisons of the run."""
    families: list[tuple[Callable[[dict], dict | None], str, str]] = [
        (lambda r: r, "p_value", "p_adjusted"),
        (lambda r: r["deadlock"], "p_value", "p_adjusted"),
        (lambda r: r["paired_tests"], "p_value", "p_adjusted"),
        (lambda r: r["paired_tests"], "wilcoxon_p", "wilcoxon_p_adjusted"),
        (lambda r: (r["paired_tests"] or {}).get("mcnemar"), "p_value", "p_adjusted"),
    ]
    for r in records:
        r["adjust"] = method
    for get, src, dst in families:
        holders = [h for h in (get(r) for r in records) if h is not None]
        adjusted = stats.adjust([h[src] for h in holders], method)
        for h, p in zip(holders, adjusted, strict=True):
            h[dst] = p
