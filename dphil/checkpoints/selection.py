"""Choosing which checkpoint to keep, and saying why.

The published study kept the last of 16 adapters although training reward had
peaked at step 9; nothing in its pipeline could notice. This module takes the
checkpoint records and validation episodes read by `dphil.checkpoints.record`,
puts a score on every checkpoint (`dphil.checkpoints.scores`), ranks them under
an explicit rule and reports, next to the choice, what keeping the last step
would have scored and where it ranks.

Checkpoints are ranked by one of three things (`by`):
- `last`: no ranking at all, the study's recipe, kept for comparison;
- `train`: the checkpoint record's own `train_<metric>` fields;
- `val`: the mean over validation episodes of that checkpoint (or, when no
  episodes are given, the record's `val_<metric>` fields written by training).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dphil.checkpoints.record import Checkpoint, Inputs, _dedupe, _without_selection
from dphil.checkpoints.scores import (
    METRICS,
    Curve,
    Metric,
    Stat,
    _assign,
    _ordered_runs,
    _smooth,
    _train_curves,
    _val_curves,
)
from dphil.io.errors import DataError, UsageError

BY = ("last", "train", "val")
RULES = ("best", "one-se")

# Relative slack when comparing floating scores, so 0.1 + 0.2 ties with 0.3.
_EPS = 1e-12


@dataclass
class Candidate:
    """A checkpoint with a score: `raw` at its own step, `score` after smoothing."""

    checkpoint: Checkpoint
    raw: Stat
    score: Stat
    run_index: int


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
