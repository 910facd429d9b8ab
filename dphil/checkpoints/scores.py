"""A score for every checkpoint: per-step means with their spread, as one curve per run.

Scores come from one of two places (the `source` of a selection):
- `train`: the checkpoint record's own `train_<metric>` fields;
- `val`: the mean over validation episodes of that checkpoint (or, when no
  episodes are given, the record's `val_<metric>` fields written by training).
A curve may be smoothed by a centred moving average before its steps are ranked
(`dphil.checkpoints.selection`), and is what the training-curve picture draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dphil.checkpoints.record import Checkpoint, ValEpisode, _dedupe, _is_number
from dphil.core.records import is_int
from dphil.io.errors import DataError, UsageError


@dataclass(frozen=True)
class Metric:
    """A quantity a checkpoint can be ranked on, and where each source keeps it."""

    name: str
    maximise: bool
    train_field: str
    val_field: str


METRICS: dict[str, Metric] = {
    "reward": Metric("reward", True, "train_reward", "val_reward"),
    # Total meals eaten at the table per episode (summed over philosophers).
    "meals": Metric("meals", True, "train_meals_mean", "val_meals_mean"),
    # Fraction of episodes that deadlocked: the one metric where lower is better.
    "deadlock_rate": Metric("deadlock_rate", False, "train_deadlock_rate", "val_deadlock_rate"),
    # Meals per round played (the `metrics.throughput_per_round` of a scored episode).
    "throughput": Metric("throughput", True, "train_throughput", "val_throughput"),
}


# Not dphil.core.maths.mean_ci: the same t(0.975, n-1) interval, but this mean and sd are
# exact sums (math.fsum), a tiny sd is kept rather than zeroed, and the half-width is
# t·(sd/√n), not t·sd/√n, so the numbers differ in the last bits; and a Stat is also made
# from a record's own summary and from smoothing, where there are no values to pass.
@dataclass(frozen=True)
class Stat:
    """A mean with what is known of its spread: n observations, sd (ddof 1), se, 95% CI."""

    mean: float
    n: int | None = None
    sd: float | None = None

    @property
    def se(self) -> float | None:
        if self.sd is None or not self.n:
            return None
        return self.sd / math.sqrt(self.n)

    @property
    def ci(self) -> tuple[float, float] | None:
        """The 95% Student-t interval of the mean, when n >= 2 and the sd is known."""
        se = self.se
        if se is None or self.n is None or self.n < 2:
            return None
        half = t_quantile(0.975, self.n - 1) * se
        return (self.mean - half, self.mean + half)


def stat_of(values: Sequence[float]) -> Stat:
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return Stat(mean, n, sd)


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile; scipy is imported only when an interval is actually computed."""
    from scipy.stats import t

    return float(t.ppf(p, df))


@dataclass
class Curve:
    """One run's per-step values of one source, for the plot and the report."""

    run: str | None
    source: str
    points: dict[int, Stat]
    smoothed: dict[int, Stat]


def record_curves(checkpoints: Sequence[Checkpoint], metric: str = "reward") -> list[Curve]:
    """Each run's training and validation curves of `metric` from the records' own fields.

    What `dphil-show` draws from `dphil-train` output alone: no validation
    episodes, so the validation curve is the records' `val_*` fields where
    training validated. Curves without a point are left out.
    """
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r} (expected one of {', '.join(METRICS)})")
    m = METRICS[metric]
    checkpoints = _dedupe(checkpoints)
    runs = _ordered_runs(checkpoints)
    curves = [*_train_curves(checkpoints, m, runs).values(), *_val_curves(checkpoints, {}, m, runs).values()]
    return [c for c in curves if c.points]


def _ordered_runs(checkpoints: Sequence[Checkpoint]) -> list[str | None]:
    runs: dict[str | None, None] = {}
    for c in checkpoints:
        runs.setdefault(c.run, None)
    return list(runs)


def _assign(
    checkpoints: Sequence[Checkpoint], episodes: Sequence[ValEpisode]
) -> dict[tuple[str | None, int], list[ValEpisode]]:
    """Attach each validation episode to its checkpoint; unknown steps are a data error.

    An episode without `run` belongs to the one run that has its step; if
    several runs have it, it is ambiguous and `--run` must say which.
    """
    by_step: dict[int, list[str | None]] = {}
    for c in checkpoints:
        by_step.setdefault(c.step, []).append(c.run)
    known = {c.key for c in checkpoints}
    assigned: dict[tuple[str | None, int], list[ValEpisode]] = {}
    unknown: dict[tuple[str | None, int], list[str]] = {}
    for e in episodes:
        if e.run is None:
            owners = by_step.get(e.step, [])
            if len(owners) > 1:
                raise DataError(
                    f"validation episode for step {e.step} names no run and runs "
                    f"{', '.join(repr(r) for r in owners)} all have that step: "
                    "choose one with --run",
                    source=e.where,
                )
            key = (owners[0], e.step) if owners else (None, e.step)
        else:
            key = (e.run, e.step)
            if key not in known and (None, e.step) in known:
                key = (None, e.step)  # hand-written checkpoint records without a run
        if key in known:
            assigned.setdefault(key, []).append(e)
        else:
            unknown.setdefault(key, []).append(e.where)
    if unknown:
        parts = []
        for (r, step), wheres in sorted(unknown.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            name = f"step {step}" if r is None else f"run {r!r} step {step}"
            parts.append(f"{name} ({len(wheres)} episode(s), first at {wheres[0]})")
        raise DataError("validation episodes for checkpoints not in the input: " + "; ".join(parts))
    return assigned


def _val_curves(
    checkpoints: Sequence[Checkpoint],
    assigned: dict[tuple[str | None, int], list[ValEpisode]],
    m: Metric,
    runs: Sequence[str | None],
) -> dict[str | None, Curve]:
    curves = {r: Curve(r, "val", {}, {}) for r in runs}
    scorings: dict[str, str] = {}
    for c in checkpoints:
        eps = assigned.get(c.key, [])
        if eps:
            values = []
            for e in eps:
                v = e.values[m.name]
                if v is None:
                    what = (
                        "not scored: pipe it through dphil-score"
                        if m.name == "reward"
                        else "has no rounds_played or metrics.throughput_per_round"
                    )
                    raise DataError(f"validation episode {what}", source=e.where)
                if m.name == "reward" and e.reward_key is not None:
                    scorings.setdefault(e.reward_key, e.where)
                values.append(v)
            curves[c.run].points[c.step] = stat_of(values)
        elif _is_number(c.record.get(m.val_field)):
            curves[c.run].points[c.step] = _record_stat(c.record, m.val_field, "val_episodes")
    if len(scorings) > 1:
        listed = "; ".join(f"{k} (first at {w})" for k, w in scorings.items())
        raise DataError(
            "validation episodes were scored with different rewards: "
            + listed
            + "; re-score them together with dphil-score"
        )
    return curves


def _train_curves(checkpoints: Sequence[Checkpoint], m: Metric, runs: Sequence[str | None]) -> dict[str | None, Curve]:
    curves = {r: Curve(r, "train", {}, {}) for r in runs}
    for c in checkpoints:
        if _is_number(c.record.get(m.train_field)):
            curves[c.run].points[c.step] = _record_stat(c.record, m.train_field, "train_episodes")
    return curves


def _record_stat(record: dict[str, Any], name: str, count_field: str) -> Stat:
    """A checkpoint record's own summary as a Stat.

    `<name>_std` in checkpoint records is the population sd (ddof 0) of the
    step's episodes, as dphil-train writes it; the standard error needs the
    sample sd, so it is rescaled by sqrt(n / (n - 1)).
    """
    n = record.get(count_field)
    n = n if is_int(n) and n > 0 else None
    sd = record.get(f"{name}_std")
    sample_sd = None
    if _is_number(sd) and n is not None and n >= 2:
        sample_sd = float(sd) * math.sqrt(n / (n - 1))
    return Stat(float(record[name]), n, sample_sd)


def _smooth(points: dict[int, Stat], k: int) -> dict[int, Stat]:
    """Centred moving average over k consecutive scored steps, truncated at the ends.

    The smoothed se treats the k step means as independent: sqrt(sum se_i^2) / k.
    """
    if k == 1:
        return dict(points)
    steps = sorted(points)
    half = k // 2
    out: dict[int, Stat] = {}
    for i, step in enumerate(steps):
        window = [points[s] for s in steps[max(0, i - half) : i + half + 1]]
        mean = math.fsum(s.mean for s in window) / len(window)
        ses = [s.se for s in window]
        if all(se is not None for se in ses):
            se = math.sqrt(math.fsum(se * se for se in ses)) / len(window)  # type: ignore[operator]
            n = sum(s.n or 0 for s in window)
            # Express the combined se as (sd, n) so Stat.se and Stat.ci reproduce it.
            out[step] = Stat(mean, n, se * math.sqrt(n))
        else:
            out[step] = Stat(mean)
    return out
