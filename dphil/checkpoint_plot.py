"""The picture that makes "keep the last step" visibly wrong: score per checkpoint step.

One panel; per run, the training curve and the validation curve (mean with its
95% interval where there is one, and the smoothed curve when smoothing was used),
the chosen step circled and the last step marked, so a reader sees at once how
far apart they are. matplotlib is optional and imported only here.
"""

from __future__ import annotations

from pathlib import Path

from .atomic import atomic_file
from .checkpoints import METRICS, Selection
from .errors import MissingExtraError, OutputError, UsageError

# Formats every matplotlib build writes; checked before any work is done.
FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "webp", "eps", "ps", "tif", "tiff")


def check_plot_path(path: str | Path) -> None:
    """Refuse an image name matplotlib cannot write, before selecting or exporting anything."""
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in FORMATS:
        raise UsageError(f"--plot {path}: name an image file ending in .{', .'.join(FORMATS)}")


def plot_selection(selection: Selection, path: str | Path, *, title: str | None = None) -> Path:
    """Draw `selection`'s curves into an image at `path` (written atomically)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: pip install 'dphil[plot]' "
                                "(or pip install matplotlib)") from None
    path = Path(path)
    metric = METRICS[selection.metric]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        runs = list(dict.fromkeys(c.run for c in selection.curves))
        many = len(runs) > 1
        for curve in selection.curves:
            # One run: colour tells train from validation. Several: colour tells the runs apart
            # and the line style tells train (dotted) from validation (solid).
            index = runs.index(curve.run) if many else int(curve.source == "train")
            colour = colours[index % len(colours)]
            steps = sorted(curve.points)
            means = [curve.points[s].mean for s in steps]
            label = curve.source + (f" ({curve.run})" if many and curve.run is not None else "")
            style = "-" if curve.source == "val" else ":"
            ax.plot(steps, means, style, marker="o", markersize=3, color=colour, label=label)
            cis = [curve.points[s].ci for s in steps]
            if any(ci is not None for ci in cis):
                lo = [ci[0] if ci else m for ci, m in zip(cis, means, strict=True)]
                hi = [ci[1] if ci else m for ci, m in zip(cis, means, strict=True)]
                ax.fill_between(steps, lo, hi, color=colour, alpha=0.15, linewidth=0)
            if curve.smoothed and any(curve.smoothed[s] != curve.points[s] for s in steps):
                ax.plot(steps, [curve.smoothed[s].mean for s in steps], "--", color=colour,
                        alpha=0.8, label=f"{label}, smoothed")
        for i, record in enumerate(selection.chosen):
            sel = record["selection"]
            if sel["score"] is not None:
                ax.scatter([record["step"]], [sel["score"]], s=160, facecolors="none",
                           edgecolors="black", linewidths=1.5, zorder=5,
                           label="chosen" if i == 0 else None)
            if i == 0:
                ax.axvline(record["step"], color="black", linewidth=1, alpha=0.6)
        first = selection.chosen[0]["selection"]
        ax.axvline(first["last_step"], color="red", linestyle="--", linewidth=1, alpha=0.7,
                   label=f"last step ({first['last_step']})")
        ax.set_xlabel("checkpoint step")
        goal = "higher is better" if metric.maximise else "lower is better"
        ax.set_ylabel(f"{selection.metric} ({goal})")
        how = f"--by {selection.by}"
        if selection.by != "last":
            how += f" --rule {first['rule']}" + (f" --smooth {first['smooth']}"
                                                 if first["smooth"] > 1 else "")
        ax.set_title(title or f"{how}: chosen step {selection.chosen[0]['step']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)
    return path


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
