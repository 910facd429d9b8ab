"""The picture that makes "keep the last step" visibly wrong: score per checkpoint step.

One panel; per run, the training curve and the validation curve (mean with its
95% interval where there is one, and the smoothed curve when smoothing was used),
the chosen step circled and the last step marked, so a reader sees at once how
far apart they are. `dphil-ckpt-select --plot` draws it from a selection;
`dphil-show` draws it from checkpoint records alone (`run_curve`, `curve_image`),
with the chosen step marked when `dphil-ckpt-select` output is among them.
matplotlib is optional and imported only here.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dphil.checkpoints.record import Checkpoint, Located, check_checkpoint
from dphil.checkpoints.scores import METRICS, Curve, record_curves
from dphil.checkpoints.selection import Selection
from dphil.core.records import is_int
from dphil.io.atomic import atomic_file
from dphil.io.errors import DataError, MissingExtraError, OutputError, UsageError
from dphil.io.safe import for_plot, plain_text_plots

# Formats every matplotlib build writes; checked before any work is done.
FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")


def check_plot_path(path: str | Path) -> None:
    """Refuse an image name matplotlib cannot write, before selecting or exporting anything."""
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in FORMATS:
        raise UsageError(f"--plot {path}: name an image file ending in .{', .'.join(FORMATS)}")


@dataclass
class RunCurve:
    """What a run's curve picture shows: the curves of one metric and the chosen records."""

    curves: list[Curve]
    chosen: list[dict[str, Any]]
    metric: str
    runs: list[str | None]


def run_curve(items: Iterable[Located], *, metric: str | None = None) -> RunCurve:
    """A run's curves from checkpoint records; records with a `selection` are the chosen ones.

    The input is `dphil-train` output, `dphil-ckpt-select` output, or both (the
    chosen records repeat their checkpoint's record with a `selection` added).
    The metric is `metric`, else the selection's, else reward.
    """
    checkpoints: list[Checkpoint] = []
    chosen: list[dict[str, Any]] = []
    for source, line, record in items:
        checkpoints.append(check_checkpoint(record, source, line))
        sel = record.get("selection")
        if sel is not None:
            if not isinstance(sel, dict) or not isinstance(sel.get("metric"), str):
                raise DataError("field 'selection' should be an object with a 'metric'", source=source, line=line)
            chosen.append(record)
    if not checkpoints:
        raise DataError("no checkpoint records in the input")
    metric = metric or (chosen[0]["selection"]["metric"] if chosen else "reward")
    curves = record_curves(checkpoints, metric)
    runs = list(dict.fromkeys(c.run for c in checkpoints))
    return RunCurve(curves, chosen, metric, runs)


def curve_image(curve: RunCurve, fmt: str, *, title: str | None = None) -> bytes:
    """The picture of `curve` as PNG or SVG bytes (SVG text stays text, ids are stable)."""
    plt = _pyplot("drawing a training curve")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    try:
        _draw_curves(plt, ax, curve.curves, curve.runs)
        for i, record in enumerate(curve.chosen):
            sel = record["selection"]
            y = sel["score"] if sel["metric"] == curve.metric else None
            if y is None:
                y = _value_at(curve.curves, record.get("run"), record["step"], sel.get("source"))
            _mark_chosen(ax, record["step"], y, first=i == 0, label=f"chosen: step {record['step']}")
        if curve.chosen:
            last = curve.chosen[0]["selection"].get("last_step")
            if is_int(last) and last != curve.chosen[0]["step"]:
                ax.axvline(last, color="red", linestyle="--", linewidth=1, alpha=0.7, label=f"last step ({last})")
        if not curve.curves:
            ax.text(0.5, 0.5, f"no {curve.metric} in these records", ha="center", transform=ax.transAxes)
        ax.set_xlabel("checkpoint step")
        goal = "higher is better" if METRICS[curve.metric].maximise else "lower is better"
        ax.set_ylabel(f"{curve.metric} ({goal})")
        named = [str(r) for r in curve.runs if r is not None]
        what = f"{curve.metric} per step"
        if named:
            what += f", run{'s' if len(named) > 1 else ''} {', '.join(named)}"
        if curve.chosen:
            first = curve.chosen[0]
            what += f": chosen step {first['step']} (--by {first['selection'].get('by')})"
        ax.set_title(for_plot(title or what), fontsize="medium")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        fig.tight_layout()
        return _render(fig, fmt)
    finally:
        plt.close(fig)


def plot_selection(selection: Selection, path: str | Path, *, title: str | None = None) -> Path:
    """Draw `selection`'s curves into an image at `path` (written atomically)."""
    plt = _pyplot("--plot")
    path = Path(path)
    metric = METRICS[selection.metric]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    try:
        runs = list(dict.fromkeys(c.run for c in selection.curves))
        _draw_curves(plt, ax, selection.curves, runs)
        for i, record in enumerate(selection.chosen):
            _mark_chosen(ax, record["step"], record["selection"]["score"], first=i == 0, label="chosen")
        first = selection.chosen[0]["selection"]
        ax.axvline(
            first["last_step"],
            color="red",
            linestyle="--",
            linewidth=1,
            alpha=0.7,
            label=f"last step ({first['last_step']})",
        )
        ax.set_xlabel("checkpoint step")
        goal = "higher is better" if metric.maximise else "lower is better"
        ax.set_ylabel(f"{selection.metric} ({goal})")
        how = f"--by {selection.by}"
        if selection.by != "last":
            how += f" --rule {first['rule']}" + (f" --smooth {first['smooth']}" if first["smooth"] > 1 else "")
        ax.set_title(for_plot(title or f"{how}: chosen step {selection.chosen[0]['step']}"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)
    return path


def _pyplot(what: str) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        plain_text_plots(matplotlib)  # run names and paths: plain text, never TeX
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(
            f"{what} needs matplotlib: pip install 'dphil[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def _draw_curves(plt: Any, ax: Any, curves: Sequence[Curve], runs: Sequence[str | None]) -> None:
    """Each curve as a line with a marker per step (SVG group id `curve-SOURCE-RUNINDEX`)."""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    many = len(runs) > 1
    validated = {c.run for c in curves if c.source == "val"}
    for curve in curves:
        # One run: colour tells train from validation. Several: colour tells the runs apart
        # and the line style tells train (dotted) from validation (solid).
        run_index = runs.index(curve.run)
        index = run_index if many else int(curve.source == "train")
        colour = colours[index % len(colours)]
        steps = sorted(curve.points)
        means = [curve.points[s].mean for s in steps]
        label = for_plot(curve.source + (f" ({curve.run})" if many and curve.run is not None else ""))
        # One band per run, or overlapping bands turn to mud: validation's interval where
        # there is validation (the held-out number), else training's.
        cis = [curve.points[s].ci for s in steps]
        banded = (curve.source == "val" or curve.run not in validated) and any(cis)
        style = "-" if curve.source == "val" else ":"
        ax.plot(
            steps,
            means,
            style,
            marker="o",
            markersize=3,
            color=colour,
            label=label + (", 95% CI" if banded and not many else ""),
            gid=f"curve-{curve.source}-{run_index}",
        )
        if banded:
            lo = [ci[0] if ci else m for ci, m in zip(cis, means, strict=True)]
            hi = [ci[1] if ci else m for ci, m in zip(cis, means, strict=True)]
            ax.fill_between(steps, lo, hi, color=colour, alpha=0.06 if many else 0.15, linewidth=0)
        if curve.smoothed and any(curve.smoothed[s] != curve.points[s] for s in steps):
            ax.plot(
                steps,
                [curve.smoothed[s].mean for s in steps],
                "--",
                color=colour,
                alpha=0.8,
                label=f"{label}, smoothed",
            )


def _mark_chosen(ax: Any, step: int, y: float | None, *, first: bool, label: str) -> None:
    """A ring around the chosen point (SVG group id `chosen-STEP`) and, for the first, a line."""
    if y is not None:
        ax.scatter(
            [step],
            [y],
            s=160,
            facecolors="none",
            edgecolors="black",
            linewidths=1.5,
            zorder=5,
            label=label if first else None,
            gid=f"chosen-{step}",
        )
    if first:
        ax.axvline(step, color="black", linewidth=1, alpha=0.6)


def _value_at(curves: Sequence[Curve], run: str | None, step: int, source: Any) -> float | None:
    order = [source, "val", "train"] if source in ("val", "train") else ["val", "train"]
    for src in order:
        for c in curves:
            if c.run == run and c.source == src and step in c.points:
                return c.points[step].mean
    return None


def _render(fig: Any, fmt: str) -> bytes:
    """PNG or SVG bytes; SVG keeps text as text and has no date, so reruns are identical."""
    import matplotlib

    buf = io.BytesIO()
    if fmt == "svg":
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dphil"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
    elif fmt == "png":
        fig.savefig(buf, format="png", metadata={"Software": None})
    else:
        raise UsageError(f"a curve is drawn as png or svg, not {fmt!r}")
    return buf.getvalue()


def _save(fig, path: Path) -> None:
    """Render to a temporary file beside `path`, then rename: no half-written images."""
    check_plot_path(path)
    try:
        with atomic_file(path) as fh:
            fig.savefig(fh, format=path.suffix.lstrip(".").lower())
    except ValueError as e:  # matplotlib: unsupported format
        raise OutputError(f"{path}: cannot write this image format: {e}") from None
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror}") from None
