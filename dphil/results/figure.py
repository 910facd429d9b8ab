"""The cells as a picture: mean reward and deadlock rate per cell (`dphil-stats --plot`, the html page).

matplotlib is an optional extra, imported only when a plot is asked for; `check_plot` refuses a
bad file name or a missing matplotlib before any episode is read. Labels are the cells' values
as the tables show them (`dphil.results.report.value_text`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from dphil.io.atomic import atomic_file
from dphil.io.errors import MissingExtraError, OutputError, UsageError
from dphil.io.safe import for_plot, plain_text_plots
from dphil.results.report import value_text

PLOT_FORMATS = ("png", "svg", "pdf")


def check_plot(path: str) -> str:
    """Refuse a plot file name or a missing matplotlib before any work is done; the format."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in PLOT_FORMATS:
        raise UsageError(f"--plot {path}: use a .png, .svg or .pdf file name")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib, an optional extra: pip install 'dphil[plot]'") from None
    return ext


def plot(cells: list[dict[str, Any]], by: Sequence[str], path: str) -> None:
    """Mean reward (95% t CI) and deadlock rate (95% Wilson CI) per cell: one line per
    series across N when `n` is a grouping field, otherwise one point per cell."""
    ext = check_plot(path)
    plt = _pyplot()
    fig = _figure(plt, cells, by)
    try:
        _save(fig, path, ext)
    finally:
        plt.close(fig)


def plot_svg(cells: list[dict[str, Any]], by: Sequence[str]) -> str:
    """The same picture as an `<svg>` element to put inline in a page (text kept as text)."""
    import io

    import matplotlib

    plt = _pyplot()
    fig = _figure(plt, cells, by)
    buf = io.StringIO()
    try:
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dphil-stats"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
    finally:
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    plain_text_plots(matplotlib)  # labels are model names: plain text, never TeX
    import matplotlib.pyplot as plt

    return plt


def _figure(plt: Any, cells: list[dict[str, Any]], by: Sequence[str]) -> Any:
    cells = [c for c in cells if c["episodes"]]
    x_field = "n" if "n" in by else None
    series_fields = [f for f in by if f != x_field]
    series: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        label = for_plot(", ".join(value_text(c[f]) for f in series_fields) or "all")
        series.setdefault(label, []).append(c)
    fig, (ax_r, ax_d) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = list(series)
    for k, (label, group) in enumerate(series.items()):
        if x_field:
            group = sorted(group, key=lambda c: c[x_field])
            xs = [c[x_field] for c in group]
        else:
            xs = [k] * len(group)
        for ax, mean_key, ci_key in ((ax_r, "reward_mean", "reward_ci"), (ax_d, "deadlock_rate", "deadlock_ci")):
            ys = [c[mean_key] for c in group]
            lo = [y - (c[ci_key] or [y, y])[0] for c, y in zip(group, ys, strict=True)]
            hi = [(c[ci_key] or [y, y])[1] - y for c, y in zip(group, ys, strict=True)]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label, linestyle="-" if x_field else "none")
    for ax, title in ((ax_r, "Mean reward (95% CI)"), (ax_d, "Deadlock rate (95% Wilson CI)")):
        ax.set_title(title)
        if x_field:
            ax.set_xlabel("N (philosophers)")
            ax.set_xticks(sorted({c[x_field] for c in cells}))
        else:
            ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        ax.grid(alpha=0.3)
    ax_d.set_ylim(-0.02, 1.02)
    if x_field and len(labels) > 1:
        ax_r.legend(fontsize="small")
    fig.tight_layout()
    return fig


def _save(fig: Any, path: str, ext: str) -> None:
    """Write the figure to a temporary file next to `path` and rename it into place."""
    try:
        with atomic_file(path) as fh:
            fig.savefig(fh, format=ext)
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror}") from None
