"""The recipe experiment's report: what summary.json quotes and the training-curve figures.

Separate from bench/recipes.py, which runs the experiment, so that each stays readable; both
read only what dphil's own commands wrote (dphil-stats records, dphil-train journals).
"""

from __future__ import annotations

import os
from pathlib import Path
from statistics import mean


def digest(records: list[dict]) -> dict:
    """The numbers the README quotes, from dphil-stats' own records."""
    cells = {
        f"{r['recipe']}/n={r['n']}": {
            k: r.get(k)
            for k in ("episodes", "reward_mean", "reward_ci", "meals_mean", "deadlock_rate", "degenerate_rate")
        }
        for r in records
        if r["kind"] == "cell"
    }
    comps = {}
    for r in records:
        if r["kind"] != "comparison":
            continue
        comps[f"{r['a']['value']}→{r['b']['value']} n={r.get('n')}"] = {
            k: r.get(k) for k in ("diff", "p_value", "p_adjusted", "hedges_g", "hedges_g_ci", "paired", "clustered")
        }
    return {"cells": cells, "comparisons": comps}


def curve(records: list[dict]) -> dict:
    keys = (
        "train_reward",
        "train_meals_mean",
        "train_deadlock_rate",
        "val_reward",
        "val_meals_mean",
        "val_deadlock_rate",
        "advantage_tied_groups",
        "advantage_groups",
        "n",
    )
    return {str(r["step"]): {k: r.get(k) for k in keys if k in r} for r in records}


def plot_curves(summary: dict, out: Path) -> None:
    """One figure per trained recipe: training and validation curves, thin per seed, thick mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("train_reward", "training reward (own)"),
        ("val_reward", "validation reward (own)"),
        ("train_meals_mean", "meals / training episode"),
        ("val_meals_mean", "meals / val episode"),
        ("train_deadlock_rate", "deadlock rate, training"),
        ("val_deadlock_rate", "deadlock rate, val"),
    ]
    for name, runs in summary["training"].items():
        fig, axes = plt.subplots(3, 2, figsize=(10, 8.5), sharex=True)
        for ax, (key, title) in zip(axes.flat, panels, strict=True):
            series = []
            for seed, steps in runs.items():
                pts = sorted((int(s), v[key]) for s, v in steps.items() if v.get(key) is not None)
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, lw=1, alpha=0.4, label=seed)
                series.append(dict(pts))
            common = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if common:
                ax.plot(common, [mean(s[x] for s in series) for x in common], lw=2.4, color="black", label="mean")
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
        axes[0, 0].legend(fontsize=8)
        for ax in axes[-1]:
            ax.set_xlabel("step")
        r = summary["recipes"][name]
        fig.suptitle(f"{name}: reward {r['reward']}, --advantage {r['advantage']}, {' '.join(r['sizes'])}", fontsize=11)
        fig.tight_layout()
        tmp = out / f".curve-{name}.png"
        fig.savefig(tmp, dpi=80)
        os.replace(tmp, out / f"curve-{name}.png")
        plt.close(fig)
