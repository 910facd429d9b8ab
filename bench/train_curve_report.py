"""bench/train_curve.py's report: the numbers per training reward over seeds, and the figure.

Apart from the script that runs the experiment so that each reads on its own; both see only
summary.json's contents (what dphil's commands wrote, gathered per run).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import mean

VARIANTS = ("paper", "shaped")  # the training rewards compared, in every table and figure in this order
COLOURS = {"paper": "tab:blue", "shaped": "tab:orange"}


def aggregate(runs: dict, steps: int) -> dict:
    """Per training reward, means over seeds of the first and last quarter of training."""
    k = max(1, steps // 4)
    out = {}
    for variant in VARIANTS:
        rs = [r for r in runs.values() if r["train_reward"] == variant]

        def window(section: str, field: str, lo: int, hi: int, rs=rs) -> float:
            return mean(v for r in rs for s, v in r[section][field].items() if lo <= int(s) < hi)

        out[variant] = {
            f"train_first_{k}_steps": {
                f: window("train", f, 0, k) for f in ("reward_paper", "reward_shaped", "meals", "deadlock_rate")
            },
            f"train_last_{k}_steps": {
                f: window("train", f, steps - k, steps)
                for f in ("reward_paper", "reward_shaped", "meals", "deadlock_rate")
            },
            "best_steps": [r["selection"]["best_step"] for r in rs],
            "cost_of_keeping_last": [r["selection"]["cost_of_keeping_last"] for r in rs],
            "val_meals_best": [r["selection"]["best_val_meals"] for r in rs],
            "val_meals_last": [r["selection"]["last_val_meals"] for r in rs],
        }
    return out


def plot(summary: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.6))
    panels = [
        (axes[0, 0], "train", "reward_paper", "training reward, scored with the PAPER reward"),
        (axes[0, 1], "train", "reward_shaped", "training reward, scored with the SHAPED reward"),
        (axes[0, 2], "val", "reward_own", "held-out reward (own training reward)"),
        (axes[1, 0], "train", "meals", "meals per training episode"),
        (axes[1, 1], "train", "deadlock_rate", "deadlock rate, training episodes"),
        (axes[1, 2], "val", "meals", "held-out meals per episode"),
    ]
    base = summary["base_val"]
    for ax, section, field, title in panels:
        for variant in VARIANTS:
            rs = [r for r in summary["runs"].values() if r["train_reward"] == variant]
            colour = COLOURS[variant]
            series = []
            for r in rs:
                data = {int(s): v for s, v in r[section][field].items()}
                if section == "val":  # step 0 is the shared base model
                    data[0] = base[variant]["reward"] if field == "reward_own" else base[variant]["meals"]
                xs = sorted(data)
                series.append([data[x] for x in xs])
                ax.plot(xs, [data[x] for x in xs], color=colour, alpha=0.35, lw=1)
                if section == "val":
                    sel = r["selection"]
                    ax.plot(
                        sel["best_step"],
                        data[sel["best_step"]],
                        marker="*",
                        ms=13,
                        color=colour,
                        mec="black",
                        ls="none",
                    )
                    ax.plot(
                        sel["last_step"], data[sel["last_step"]], marker="s", ms=6, color=colour, mec="black", ls="none"
                    )
            ax.plot(
                xs,
                [mean(col) for col in zip(*series, strict=True)],
                color=colour,
                lw=2.2,
                marker="o",
                ms=3,
                label=f"trained on {variant} (mean of {len(rs)} seeds)",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("adapter step")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[0, 2].plot(
        [], [], marker="*", ms=11, color="grey", mec="black", ls="none", label="kept by dphil-ckpt-select --by val"
    )
    axes[0, 2].plot([], [], marker="s", ms=6, color="grey", mec="black", ls="none", label="last step")
    axes[0, 2].legend(fontsize=8)
    fig.suptitle(
        f"GRPO (dphil-train --backend peft, LoRA r=8) on a tiny RANDOM Qwen3, CPU: N={args.n}, "
        f"{args.rounds} rounds, {args.groups}x{args.group_size} episodes/step, lr {args.lr}; "
        f"thin: single seeds, thick: mean; val: {args.val_seeds} every {args.val_every} steps",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
