"""Comparisons: `--compare FIELD A B`, B against A within each group of the other --by fields.

Each comparison record carries Welch's t, Hedges' g, the two-proportion test of the
deadlock rates and, where the arms share seeds, the paired tests; p values are adjusted
for multiplicity across every comparison of the run, one family per test. Arms that share
seeds but cannot be paired (a seed twice in an arm, episodes without one) say so in the
record's notes and in a warning. With `cluster` (`--cluster run`), each record also tests the
arms over clusters: the mean of each cluster (each training run, say) is one unit, an
episode without the field is a unit of its own (an untrained model's episodes are
independent), so p reflects how few training runs stand behind an arm. The arms' episodes
are what reading kept for each comparison (`dphil.results.tally.Arms`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import polars as pl

from dphil.core import maths as stats
from dphil.core.records import SCHEMA_VERSION
from dphil.io.errors import UsageError
from dphil.results.cells import _label, _pair, _rate
from dphil.results.fields import Compare
from dphil.results.frame import Episodes, Warn, _silent
from dphil.results.tally import Key

__all__ = ["Compare", "comparison_records"]


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
    cluster: str | None = None,
) -> list[dict[str, Any]]:
    """One `kind: "comparison"` record per --compare and group of the other `by` fields,
    with p values adjusted for multiplicity across all of them (per test); with `cluster`
    (a field the episodes were read with) also the test over its clusters."""
    if adjust not in stats.ADJUSTMENTS:
        raise UsageError(f"unknown --adjust {adjust!r}")
    records: list[dict[str, Any]] = []
    for comp in compares:
        if comp.a == comp.b:
            raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: A and B are the same")
        if comp not in episodes.arms:
            raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: the episodes were read without it")
        rest = [f for f in by if f != comp.field]
        episodes.check_read(rest)
        if cluster is not None:
            episodes.check_read([cluster])
        groups = _groups(episodes, comp, rest, cluster)
        for side, value in enumerate((comp.a, comp.b)):
            if not any(arms[side] for arms in groups.values()):
                raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: no episodes with {comp.field} = {value!r}")
        for key in sorted(groups, key=lambda k: tuple((v is None, v) for v in k)):
            group = dict(zip(rest, key, strict=True))
            arm_a, arm_b = groups[key]
            if not arm_a or not arm_b:
                missing = comp.a if not arm_a else comp.b
                warn(f"{_label(group)}: no episodes with {comp.field} = {missing!r}; comparison skipped")
                continue
            a, b = (pl.concat([piece for _, piece in arm], rechunk=True) for arm in (arm_a, arm_b))
            values = (arm_a[0][0], arm_b[0][0])
            record = _compare(comp, group, a, b, values, power=power, effect=effect, confidence=confidence, warn=warn)
            if cluster is not None:
                record["clustered"] = _clustered(cluster, a, b, confidence, record["notes"])
            records.append(record)
    _adjust_all(records, adjust)
    return records


Arm = list[tuple[Any, pl.DataFrame]]  # (the field's value, episodes) per key read


def _groups(
    episodes: Episodes, comp: Compare, rest: Sequence[str], cluster: str | None = None
) -> dict[Key, tuple[Arm, Arm]]:
    """The episodes of each arm per group of the `rest` fields, settled now that every type is known;
    with `cluster`, each episode's value of it in a `_cluster` column (text, null where absent)."""
    arms = episodes.arms[comp]
    pieces = arms.joined()
    raw = list(pieces)
    typed = episodes.typed(raw, arms.keys)
    if not typed:
        return {}
    at = arms.keys.index(comp.field)
    where = [arms.keys.index(f) for f in rest]
    texts = pl.Series([t[at] for t in typed], dtype=episodes.types[comp.field]).cast(pl.String).to_list()
    groups: dict[Key, tuple[Arm, Arm]] = {}
    for key, values, text in zip(raw, typed, texts, strict=True):
        if text not in (comp.a, comp.b):
            continue
        arm_a, arm_b = groups.setdefault(tuple(values[i] for i in where), ([], []))
        piece = pieces[key]
        if cluster is not None:
            unit = key[arms.keys.index(cluster)]
            piece = piece.with_columns(pl.lit(None if unit is None else str(unit), dtype=pl.String).alias("_cluster"))
        (arm_a if text == comp.a else arm_b).append((values[at], piece))
    return groups


def _compare(
    comp: Compare,
    group: dict[str, Any],
    a: pl.DataFrame,
    b: pl.DataFrame,
    values: tuple[Any, Any],
    *,
    power: bool,
    effect: float | None,
    confidence: float,
    warn: Warn,
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
        "a": _arm(values[0], a, a_ok, ra, ka, confidence),
        "b": _arm(values[1], b, b_ok, rb, kb, confidence),
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
    pairs, unpaired = _pairs(a_ok, b_ok, notes)
    if unpaired is not None:
        notes.append(unpaired)
        warn(f"--compare {comp.field} {comp.a} {comp.b} ({_label(group)}): {unpaired}; unpaired tests only")
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


def _clustered(field: str, a: pl.DataFrame, b: pl.DataFrame, confidence: float, notes: list[str]) -> dict[str, Any]:
    """Welch's t over units: the mean reward (and deadlock rate) of each cluster of `field`, or
    an episode where the field is absent. Episodes within a training run share its weights, so
    they are not independent draws of the recipe; the runs are."""
    ua, ub = _units(a.filter(~pl.col("_error"))), _units(b.filter(~pl.col("_error")))
    block: dict[str, Any] = {
        "field": field,
        "a_units": None if ua is None else len(ua[0]),
        "b_units": None if ub is None else len(ub[0]),
        "diff": None,
        "diff_ci": None,
        "t": None,
        "df": None,
        "p_value": None,
        "p_adjusted": None,
        "deadlock": {"diff": None, "p_value": None, "p_adjusted": None},
    }
    if ua is None or ub is None:
        notes.append(f"an arm mixes episodes with and without {field}: no test over clusters")
        return block
    reward, dead = stats.welch(ua[0], ub[0], confidence), stats.welch(ua[1], ub[1], confidence)
    block |= {
        "diff": reward.diff,
        "diff_ci": _pair(reward.lo, reward.hi),
        "t": reward.t,
        "df": reward.df,
        "p_value": reward.p_value,
        "p_adjusted": reward.p_value,
        "deadlock": {"diff": dead.diff, "p_value": dead.p_value, "p_adjusted": dead.p_value},
    }
    fewest = min(len(ua[0]), len(ub[0]))
    if fewest < 2:
        notes.append(f"an arm has fewer than 2 units of {field}: no test over clusters")
        return block
    if fewest == 2:
        notes.append(f"an arm has 2 units of {field}: the test over clusters has little power")
    for side, units in (("A", ua[0]), ("B", ub[0])):
        if len(units) >= 2 and float(units.max() - units.min()) == 0.0:
            notes.append(f"arm {side}'s units of {field} all have one mean reward: Welch takes it as exact")
    return block


def _units(ok: pl.DataFrame) -> tuple[Any, Any] | None:
    """Per unit, the mean reward and deadlock rate; None when only some episodes have a cluster.

    Units are unweighted (a run with 10 complete episodes counts as much as one with 30): the
    question is how the recipe's runs differ, not its episodes. Errored episodes are left out
    first, so a run whose every episode errored is no unit."""
    has = ok["_cluster"].is_not_null()
    if ok.height and has.all():
        means = ok.group_by("_cluster").agg(pl.col("_reward").mean(), pl.col("_deadlock").cast(pl.Float64).mean())
        return means["_reward"].to_numpy(), means["_deadlock"].to_numpy()
    if has.any():
        return None
    return ok["_reward"].to_numpy(), ok["_deadlock"].cast(pl.Float64).to_numpy()


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


def _pairs(a: pl.DataFrame, b: pl.DataFrame, notes: list[str]) -> tuple[pl.DataFrame | None, str | None]:
    """Episodes matched by seed, when both arms use each seed at most once and share >= 2;
    else why they cannot be paired (None when the arms share no seed: unpaired by design)."""
    sa, sb = a["_seed"], b["_seed"]
    if not sa.drop_nulls().is_in(sb.drop_nulls()).any():
        return None, None
    if sa.null_count() or sb.null_count():
        return None, "some episodes have no seed: episodes cannot be paired by seed"
    if sa.n_unique() != len(sa) or sb.n_unique() != len(sb):
        return None, "seeds repeat within an arm: episodes cannot be paired by seed"
    cols = ["_seed", "_reward", "_deadlock"]
    joined = a.select(cols).join(b.select(cols), on="_seed", how="inner", suffix="_b")
    if joined.height < 2:
        return None, "the arms share a single seed: too few to pair"
    unmatched = len(sa) + len(sb) - 2 * joined.height
    if unmatched:
        notes.append(
            f"paired tests use the {joined.height} seeds found in both arms; "
            f"{unmatched} episode(s) without a partner are left out of them"
        )
    return joined.sort("_seed"), None


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
        (lambda r: r.get("clustered"), "p_value", "p_adjusted"),
        (lambda r: (r.get("clustered") or {}).get("deadlock"), "p_value", "p_adjusted"),
    ]
    for r in records:
        r["adjust"] = method
    for get, src, dst in families:
        holders = [h for h in (get(r) for r in records) if h is not None]
        adjusted = stats.adjust([h[src] for h in holders], method)
        for h, p in zip(holders, adjusted, strict=True):
            h[dst] = p
