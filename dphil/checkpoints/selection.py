"""Choosing which checkpoint to keep, and saying why.

The published study kept the last of 16 adapters although training reward had
peaked at step 9; nothing in its pipeline could notice. This module reads
`kind: "checkpoint"` records and scored validation episodes tagged with
`checkpoint_step` (in any order, from any number of inputs), puts a score on
every checkpoint, ranks them under an explicit rule and reports, next to the
choice, what keeping the last step would have scored and where it ranks.

Scores come from one of three places (`by`):
- `last`: no ranking at all, the study's recipe, kept for comparison;
- `train`: the checkpoint record's own `train_<metric>` fields;
- `val`: the mean over validation episodes of that checkpoint (or, when no
  episodes are given, the record's `val_<metric>` fields written by training).

Nothing here knows about click or files; readers hand in `(source, line,
record)` triples so every error can name where the record came from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dphil.core.records import checked_outcome, is_int
from dphil.io.errors import DataError, UsageError

BY = ("last", "train", "val")
RULES = ("best", "one-se")

# Located records: where a record came from, for error messages.
Located = tuple[str, int, dict[str, Any]]


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

# The record fields selection reads as numbers (null allowed: a step without episodes).
_NUMERIC_FIELDS = tuple(
    f"{prefix}_{name}"
    for prefix in ("train", "val")
    for name in ("reward", "reward_std", "meals_mean", "deadlock_rate", "throughput")
)

# Relative slack when comparing floating scores, so 0.1 + 0.2 ties with 0.3.
_EPS = 1e-12


# -- records ---------------------------------------------------------------------------


@dataclass
class Checkpoint:
    """One saved adapter: its record as read, and the fields selection uses."""

    record: dict[str, Any]
    run: str | None
    step: int
    path: str | None
    where: str

    @property
    def key(self) -> tuple[str | None, int]:
        return (self.run, self.step)

    def label(self) -> str:
        return f"step {self.step}" if self.run is None else f"run {self.run!r} step {self.step}"


@dataclass
class ValEpisode:
    """What selection needs of one validation episode: its checkpoint and its metric values."""

    run: str | None
    step: int
    where: str
    values: dict[str, float | None]
    reward_key: str | None


@dataclass
class Inputs:
    """Everything read from the inputs, sorted into checkpoints and validation episodes."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    episodes: list[ValEpisode] = field(default_factory=list)
    error_episodes: int = 0
    train_episodes: int = 0


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _where(source: str, line: int) -> str:
    return f"{source}:{line}"


def check_checkpoint(record: dict[str, Any], source: str = "<input>", line: int = 0) -> Checkpoint:
    """Validate a checkpoint record's fields that selection relies on; return it parsed.

    Hand-written records need only `step` (and usually `run`, `path`,
    `train_reward`); every field present must have the right type.
    """
    try:
        if record.get("kind") != "checkpoint":
            raise DataError(f"expected a checkpoint record, got kind {record.get('kind')!r}")
        if "step" not in record:
            raise DataError("checkpoint record is missing field 'step'")
        step = record["step"]
        if not is_int(step) or step < 0:
            raise DataError(f"field 'step' should be a non-negative integer, got {step!r}")
        for name in ("run", "path", "base_model", "backend", "reward_variant"):
            value = record.get(name)
            if value is not None and not isinstance(value, str):
                raise DataError(f"field {name!r} should be a string, got {value!r}")
        rank = record.get("lora_rank")
        if rank is not None and (not is_int(rank) or rank < 1):
            raise DataError(f"field 'lora_rank' should be a positive integer, got {rank!r}")
        for name in _NUMERIC_FIELDS:
            value = record.get(name)
            if value is not None and not _is_number(value):
                raise DataError(f"field {name!r} should be a finite number, got {value!r}")
        for name in ("train_episodes", "val_episodes"):
            value = record.get(name)
            if value is not None and (not is_int(value) or value < 0):
                raise DataError(f"field {name!r} should be a non-negative integer, got {value!r}")
    except DataError as e:
        raise e.at(source, line) from None
    return Checkpoint(record, record.get("run"), step, record.get("path"), _where(source, line))


def _episode_values(record: dict[str, Any]) -> dict[str, float | None]:
    """The four metrics of one episode; reward is None while the episode is unscored."""
    meals, deadlock = checked_outcome(record)
    reward = record.get("reward")
    total = None
    if reward is not None:
        if not isinstance(reward, dict) or not _is_number(reward.get("total")):
            raise DataError("field 'reward.total' should be a finite number")
        total = float(reward["total"])
    metrics = record.get("metrics")
    throughput = metrics.get("throughput_per_round") if isinstance(metrics, dict) else None
    if throughput is None:
        played = record.get("rounds_played")
        if is_int(played):
            throughput = sum(meals) / played if played else 0.0
    elif not _is_number(throughput):
        raise DataError("field 'metrics.throughput_per_round' should be a finite number")
    return {
        "reward": total,
        "meals": float(sum(meals)),
        "deadlock_rate": 1.0 if deadlock else 0.0,
        "throughput": None if throughput is None else float(throughput),
    }


def _reward_key(record: dict[str, Any]) -> str | None:
    """How an episode was scored (variant and weights), so mixed scorings are caught."""
    reward = record.get("reward")
    if not isinstance(reward, dict):
        return None
    weights = reward.get("weights") or {}
    parts = [str(reward.get("variant"))]
    parts += [f"{k}={weights[k]}" for k in sorted(weights)] if isinstance(weights, dict) else []
    if "min_meals" in reward:
        parts.append(f"min_meals={reward['min_meals']}")
    return " ".join(parts)


def read_inputs(items: Iterable[Located]) -> Inputs:
    """Sort located records into checkpoints and validation episodes, checking each.

    Episodes with `status: "error"` carry no outcome and are counted, not used;
    episodes tagged `split: "train"` are training rollouts, not validation, and
    are counted too. Any other kind of record is a data error.
    """
    inputs = Inputs()
    for source, line, record in items:
        kind = record.get("kind", "episode")
        if kind == "checkpoint":
            inputs.checkpoints.append(check_checkpoint(record, source, line))
            continue
        try:
            if kind != "episode":
                raise DataError(f"expected a checkpoint or episode record, got kind {kind!r}")
            if record.get("split") == "train":
                inputs.train_episodes += 1
                continue
            step = record.get("checkpoint_step")
            if step is None:
                raise DataError("episode has no 'checkpoint_step': cannot tell which checkpoint it validates")
            if not is_int(step) or step < 0:
                raise DataError(f"field 'checkpoint_step' should be a non-negative integer, got {step!r}")
            run = record.get("run")
            if run is not None and not isinstance(run, str):
                raise DataError(f"field 'run' should be a string, got {run!r}")
            if record.get("status") == "error":
                inputs.error_episodes += 1
                continue
            values = _episode_values(record)
        except DataError as e:
            raise e.at(source, line) from None
        inputs.episodes.append(ValEpisode(run, step, _where(source, line), values, _reward_key(record)))
    return inputs


def read_checkpoints(items: Iterable[Located], *, run: str | None = None) -> list[Checkpoint]:
    """Read checkpoint records only (what `dphil-rollout --checkpoints` needs), in step order.

    Identical repeats (the same file given twice) collapse to one; two different
    records for the same run and step are a data error naming both lines.
    """
    found: list[Checkpoint] = []
    for source, line, record in items:
        found.append(check_checkpoint(record, source, line))
    checkpoints = _dedupe(found)
    if run is not None:
        checkpoints = [c for c in checkpoints if c.run == run]
    return checkpoints


def located(reader: Any) -> Iterator[Located]:
    """Pair each record of a `dphil.io.jsonl.RecordReader` with its source and line."""
    for record in reader:
        yield reader.source, reader.line, record


def load_checkpoints(sources: Sequence[str], *, run: str | None = None) -> list[Checkpoint]:
    """`read_checkpoints` over files (or `-`), as `dphil-rollout --checkpoints FILE` needs."""
    from dphil.io.jsonl import RecordReader

    return read_checkpoints(located(RecordReader(list(sources))), run=run)


def _dedupe(checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    seen: dict[tuple[str | None, int], Checkpoint] = {}
    runs: dict[str | None, int] = {}
    for c in checkpoints:
        runs.setdefault(c.run, len(runs))
        earlier = seen.get(c.key)
        if earlier is None:
            seen[c.key] = c
        elif _without_selection(earlier.record) != _without_selection(c.record):
            raise DataError(
                f"two different checkpoint records for {c.label()} (also at {earlier.where})", source=c.where
            )
    return sorted(seen.values(), key=lambda c: (runs[c.run], c.step))


def _without_selection(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "selection"}


# -- statistics ------------------------------------------------------------------------


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


# -- selection -------------------------------------------------------------------------


@dataclass
class Candidate:
    """A checkpoint with a score: `raw` at its own step, `score` after smoothing."""

    checkpoint: Checkpoint
    raw: Stat
    score: Stat
    run_index: int


@dataclass
class Curve:
    """One run's per-step values of one source, for the plot and the report."""

    run: str | None
    source: str
    points: dict[int, Stat]
    smoothed: dict[int, Stat]


@dataclass
class Selection:
    """The outcome: chosen records (with `selection` added), notes for stderr, curves to plot."""

    chosen: list[dict[str, Any]]
    checkpoints: list[Checkpoint]
    notes: list[str]
    curves: list[Curve]
    by: str
    metric: str


def select(
    inputs: Inputs,
    *,
    by: str | None = None,
    metric: str = "reward",
    smooth: int = 1,
    rule: str = "best",
    top: int = 1,
    run: str | None = None,
) -> Selection:
    """Rank the checkpoints and return the top `top` records with a `selection` object each.

    `by=None` means `val` when validation scores exist and `train` otherwise.
    Smoothing is a centred moving average over `smooth` consecutive scored
    checkpoints of the same run (truncated at the ends). Ties go to the earlier step.
    """
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r} (expected one of {', '.join(METRICS)})")
    if by is not None and by not in BY:
        raise UsageError(f"unknown --by {by!r} (expected one of {', '.join(BY)})")
    if rule not in RULES:
        raise UsageError(f"unknown --rule {rule!r} (expected one of {', '.join(RULES)})")
    if smooth < 1 or smooth % 2 == 0:
        raise UsageError(f"--smooth must be an odd number of steps >= 1 (centred), got {smooth}")
    if top < 1:
        raise UsageError(f"--top must be at least 1, got {top}")
    if by == "last" and rule != "best":
        raise UsageError("--rule applies to --by train or val; --by last takes the last step")
    m = METRICS[metric]
    notes: list[str] = []

    checkpoints = _dedupe(inputs.checkpoints)
    if not checkpoints:
        raise DataError("no checkpoint records in the input")
    runs = _ordered_runs(checkpoints)
    episodes = inputs.episodes
    if run is not None:
        if run not in runs:
            known = ", ".join(repr(r) for r in runs if r is not None) or "none named"
            raise UsageError(f"no checkpoint records for run {run!r} (runs: {known})")
        checkpoints = [c for c in checkpoints if c.run == run]
        episodes = [e for e in episodes if e.run in (None, run)]
        runs = [run]
    if inputs.error_episodes:
        notes.append(f"{inputs.error_episodes} validation episode(s) with status 'error' left out")
    if inputs.train_episodes:
        notes.append(f"{inputs.train_episodes} training episode(s) (split 'train') left out")

    assigned = _assign(checkpoints, episodes)
    val_curves = _val_curves(checkpoints, assigned, m, runs)
    train_curves = _train_curves(checkpoints, m, runs)
    has_val = any(c.points for c in val_curves.values())
    if by is None:
        by = "val" if has_val else "train"
    if by == "val" and not has_val:
        raise DataError(
            f"--by val: no validation episodes tagged with checkpoint_step and no "
            f"'{m.val_field}' field in the checkpoint records"
        )
    if by == "last" and len(runs) > 1:
        raise UsageError(
            f"--by last needs a single run; the input has {', '.join(repr(r) for r in runs)}: choose one with --run"
        )

    curves = {"train": train_curves, "val": val_curves}
    source = by if by != "last" else ("val" if has_val else "train")
    for curve in curves[source].values():
        curve.smoothed = _smooth(curve.points, smooth)
    if by == "train" and not any(c.points for c in train_curves.values()):
        raise DataError(f"--by train: no checkpoint record has '{m.train_field}'")

    candidates = _candidates(checkpoints, curves[source], runs, source, notes)
    if by == "last":
        ranked = sorted(checkpoints, key=lambda c: -c.step)
        scores = {c.key: curves[source][c.run].smoothed.get(c.step) for c in ranked}
        order = [(c, scores[c.key]) for c in ranked]
    else:
        if not candidates:
            raise DataError(f"no checkpoint has a {source} {metric} to rank on")
        order = [(c.checkpoint, c.score) for c in _rank(candidates, m, rule)]

    last = {r: max(c.step for c in checkpoints if c.run == r) for r in runs}
    chosen: list[dict[str, Any]] = []
    for rank, (ckpt, stat) in enumerate(order[:top], start=1):
        last_step = last[ckpt.run]
        last_pos = next(
            (i for i, (c, _) in enumerate(order, start=1) if c.run == ckpt.run and c.step == last_step), None
        )
        last_stat = order[last_pos - 1][1] if last_pos is not None else None
        selection: dict[str, Any] = {
            "by": by,
            "metric": metric,
            "source": source,
            "goal": "max" if m.maximise else "min",
            "rule": rule if by != "last" else None,
            "smooth": smooth,
            "rank": rank,
            "score": None if stat is None else stat.mean,
            "se": None if stat is None else stat.se,
            "ci": None if stat is None or stat.ci is None else list(stat.ci),
            "n": None if stat is None else stat.n,
            "candidates": len(order),
            "last_step": last_step,
            "last_score": None if last_stat is None else last_stat.mean,
            "last_rank": last_pos,
        }
        chosen.append({**_without_selection(ckpt.record), "selection": selection})
    plot_curves = [c for src in ("train", "val") for c in curves[src].values() if c.points]
    return Selection(chosen, checkpoints, notes, plot_curves, by, metric)


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


def _candidates(
    checkpoints: Sequence[Checkpoint],
    curves: dict[str | None, Curve],
    runs: Sequence[str | None],
    source: str,
    notes: list[str],
) -> list[Candidate]:
    run_index = {r: i for i, r in enumerate(runs)}
    out: list[Candidate] = []
    unscored: list[str] = []
    for c in checkpoints:
        curve = curves[c.run]
        if c.step in curve.smoothed:
            out.append(Candidate(c, curve.points[c.step], curve.smoothed[c.step], run_index[c.run]))
        else:
            unscored.append(c.label())
    if unscored and out:
        notes.append(f"no {source} score for {', '.join(unscored)}: not a candidate")
    return out


def _rank(candidates: Sequence[Candidate], m: Metric, rule: str) -> list[Candidate]:
    """Order candidates by preference under `rule`; ties go to the earlier step (then run)."""
    sign = 1.0 if m.maximise else -1.0

    def better_first(c: Candidate) -> tuple[float, int, int]:
        return (-sign * c.score.mean, c.checkpoint.step, c.run_index)

    ranked = sorted(candidates, key=better_first)
    # Equal within float noise counts as a tie: resort those groups by step.
    ranked = _stable_ties(ranked, sign)
    if rule == "best":
        return ranked
    best = ranked[0]
    se = best.score.se
    if se is None:
        raise DataError(
            "--rule one-se needs a standard error for the best checkpoint "
            f"({best.checkpoint.label()}): give validation episodes (two or more per step), "
            "or checkpoint records with "
            f"'{m.train_field}_std' and 'train_episodes'"
        )
    threshold = best.score.mean - sign * se
    tol = _EPS * max(1.0, abs(threshold))
    within = [c for c in ranked if sign * (c.score.mean - threshold) >= -tol]
    within.sort(key=lambda c: (c.checkpoint.step, c.run_index))
    rest = [c for c in ranked if c not in within]
    return within + rest


def _stable_ties(ranked: list[Candidate], sign: float) -> list[Candidate]:
    out: list[Candidate] = []
    i = 0
    while i < len(ranked):
        j = i + 1
        head = ranked[i].score.mean
        while j < len(ranked) and abs(ranked[j].score.mean - head) <= _EPS * max(1.0, abs(head)):
            j += 1
        out.extend(sorted(ranked[i:j], key=lambda c: (c.checkpoint.step, c.run_index)))
        i = j
    return out


def summary(selection: Selection) -> str:
    """One line for stderr: what was chosen, and what keeping the last step would have given."""
    record = selection.chosen[0]
    sel = record["selection"]
    who = f"step {record['step']}" + (f" of run {record['run']!r}" if record.get("run") else "")
    parts = [f"chose {who} by {sel['by']}"]
    if sel["score"] is not None:
        text = f"{sel['source']} {sel['metric']} {sel['score']:.4g}"
        if sel["ci"] is not None:
            text += f" (95% CI {sel['ci'][0]:.4g} to {sel['ci'][1]:.4g}, n={sel['n']})"
        parts.append(text)
    parts.append(f"{sel['candidates']} candidates")
    if sel["last_step"] != record["step"]:
        last = f"last step {sel['last_step']}"
        if sel["last_score"] is not None:
            last += f" scores {sel['last_score']:.4g}, rank {sel['last_rank']}"
        else:
            last += " has no score"
        parts.append(last)
    else:
        parts.append("the last step is the choice")
    return "; ".join(parts)
