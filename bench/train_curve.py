"""CPU evidence: GRPO training-reward curves under the `paper` and `shaped` rewards.

Builds the tiny random Qwen3 model of the test suite (no download), then runs
the toolkit's own command twice, once per training reward:

    dphil-train --backend peft --base-model TINY --reward {paper,shaped} ... > ckpts.jsonl

and plots, per step, the training reward (each run under its own reward) and
the held-out validation meals and deadlock rate, marking the best step of each
run. What it shows: the loop, the reward plumbing and the checkpoint records
work end to end, and which behaviour each reward pays for (the paper reward is
already near its maximum when nobody eats; the shaped one is not). What it does
not show: anything about real language models; the policy is a 250k-parameter
random network whose only learnable signal is the action prior.

    python bench/train_curve.py --steps 12 --out bench/results/train_curve
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Philosopher $seat of $n. Forks $left_fork and $right_fork.\n$rules\n$answer\n"


def train(variant: str, model: Path, out: Path, args: argparse.Namespace) -> list[dict]:
    run_dir = args.work / f"run-{variant}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        shutil.which("dphil-train") or "dphil-train",
        "--backend",
        "peft",
        "--base-model",
        str(model),
        "--run-dir",
        str(run_dir),
        "--reward",
        variant,
        "-n",
        str(args.n),
        "--rounds",
        str(args.rounds),
        "--steps",
        str(args.steps),
        "--groups",
        str(args.groups),
        "--group-size",
        str(args.group_size),
        "--lr",
        str(args.lr),
        "--prompt-file",
        str(args.work / "prompt.txt"),
        "--memory",
        "none",
        "--threads",
        "1",
        "--seed",
        str(args.seed),
        "--val-every",
        "1",
        "--val-seeds",
        "100000-100007",
        "--episodes-out",
        str(args.work / f"episodes-{variant}.jsonl"),
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"dphil-train failed ({proc.returncode}):\n{proc.stderr}")
    (out / f"ckpts-{variant}.jsonl").write_text(proc.stdout)
    print(f"{variant}: {args.steps} steps in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train_curve")
    ap.add_argument("--work", type=Path, default=ROOT / "bench" / "out" / "train_curve",
                    help="Where the model, adapters and episodes go (large; not committed).")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "prompt.txt").write_text(PROMPT)
    sys.path.insert(0, str(ROOT))
    from tests.tinymodel import build_tiny_model

    model = build_tiny_model(args.work / "tiny-model")
    runs = {v: train(v, model, args.out, args) for v in ("paper", "shaped")}

    summary = {}
    for v, recs in runs.items():
        best = max(recs, key=lambda r: r["val_reward"])
        summary[v] = {
            "train_reward": [r["train_reward"] for r in recs],
            "val_reward": [r["val_reward"] for r in recs],
            "val_meals_mean": [r["val_meals_mean"] for r in recs],
            "val_deadlock_rate": [r["val_deadlock_rate"] for r in recs],
            "zero_std_groups": [r["zero_std_groups"] for r in recs],
            "best_val_step": best["step"],
            "last_step": recs[-1]["step"],
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for v, colour in (("paper", "tab:blue"), ("shaped", "tab:orange")):
        s = summary[v]
        steps = list(range(1, len(s["train_reward"]) + 1))
        axes[0].plot(steps, s["train_reward"], marker="o", color=colour, label=f"{v} (train)")
        axes[0].plot(steps, s["val_reward"], ls="--", color=colour, label=f"{v} (held-out)")
        axes[0].axvline(s["best_val_step"], color=colour, ls=":", lw=1)
        axes[1].plot(steps, s["val_meals_mean"], marker="o", color=colour, label=v)
        axes[2].plot(steps, s["zero_std_groups"], marker="o", color=colour, label=v)
    axes[0].set_title("reward per step (own variant); dotted: best step")
    axes[1].set_title("held-out meals per episode")
    axes[2].set_title(f"groups with no signal (of {args.groups})")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"tiny random Qwen3 (CPU), peft LoRA r=8, N={args.n}, {args.rounds} rounds, "
        f"{args.groups}x{args.group_size} episodes/step"
    )
    fig.tight_layout()
    fig.savefig(args.out / "train_curve.png", dpi=110)
    print(
        json.dumps({v: {k: summary[v][k] for k in ("best_val_step", "last_step")} for v in summary})
    )


if __name__ == "__main__":
    main()
