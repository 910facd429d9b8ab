"""CPU evidence: does the reward change what GRPO learns? `paper` vs `shaped`, tiny model.

Trains LoRA adapters on the tiny random Qwen3 model of the test suite (built
here, never downloaded) with the toolkit's own commands, once per training
reward and seed, and compares the runs on the same yardsticks:

    dphil-train --backend peft --reward {paper,shaped} --seed S ...  (checkpoints, episodes)
    dphil-rollout -m hf:TINY ...                                     (step-0 baseline)
    dphil-score --reward paper | --reward shaped                     (rescore every episode)
    dphil-stats --by split,checkpoint_step                           (per-step cells)
    dphil-ckpt-select --by val                                       (best step vs the last)

Per step and per training reward it plots the training reward under both
yardsticks, meals per episode, the deadlock rate and the held-out validation
reward and meals, with the step `dphil-ckpt-select --by val` keeps and the
last step marked; summary.json holds the numbers.

Two choices make the experiment informative rather than degenerate:
- Single-token actions. The tiny tokenizer splits `pick-up-left` into five
  pieces, so a random model scores every fork action about 1e-9 under
  constrained decoding and never eats (the first version of this experiment
  saw zero meals). The action names are added to the tokenizer as single
  tokens (new embedding rows drawn like the others), so the untrained policy
  spreads its probability over all six actions, as a real instruction-tuned
  model's prior over valid replies roughly does.
- Eight rounds and groups of eight episodes, so random play eats in some
  episodes and deadlocks in others and every group has reward variance.

The two rewards see the same scenarios and, at step 0, the very same episodes
(same base model, seed and sampling), so the curves part only because of the
reward. Seeds vary the scenarios, the sampling and the LoRA initialisation.
Runs are not bitwise repeatable: dphil-train does not seed peft's LoRA A
initialisation, so a rerun with the same seeds drifts after step 1 (the
qualitative picture held over the two invocations made so far).

What it does not show: anything about language models. The policy is a
~250k-parameter random network whose learnable signal is, in effect, a
state-dependent action prior; a few hundred episodes per run on a 3-seat table.

    python bench/train_curve.py                  # 3 seeds per reward: ~9-10 min on 2 busy cores
    python bench/train_curve.py --seeds 0,1      # ~6 min
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from jobs import ROOT, check, read_jsonl, rel, run_jobs, tool
from single_token_model import PROMPT, build_model, policy_args
from train_curve_report import VARIANTS, aggregate, plot

# A short system prompt keeps every forward pass small; the per-round observation
# (forks held, neighbours' forks, meals, last result) is still appended by the agent.


def cells(path: Path, by: str) -> list[dict]:
    """dphil-stats cells of a scored episode file."""
    out = check([tool("dphil-stats"), "-q", "--by", by, str(path)])
    return [r for r in map(json.loads, out.splitlines()) if r.get("kind") == "cell"]


def per_step(rows: list[dict], split: str, field: str) -> dict[int, float]:
    return {r["checkpoint_step"]: r[field] for r in rows if r["split"] == split}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seeds", default="0,1,2", help="Training seeds per reward (comma list).")
    ap.add_argument("--val-every", type=int, default=2)
    ap.add_argument("--val-seeds", default="100000-100015")
    ap.add_argument("--jobs", type=int, default=2, help="Training runs in parallel (1 thread each).")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train_curve")
    ap.add_argument(
        "--work",
        type=Path,
        default=ROOT / "bench" / "out" / "train_curve",
        help="Model, adapters, episodes, logs (large; not committed).",
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    t0 = time.monotonic()
    for d in (args.out, args.work):
        d.mkdir(parents=True, exist_ok=True)
    # A fresh experiment: remove only what an earlier run of this script wrote.
    for pattern in ("run-*", "tiny-*", "logs", "ep-*.jsonl", "ckpts-*.jsonl"):
        for stale in args.work.glob(pattern):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    for pattern in ("ckpts-*.jsonl", "summary.json", "train_curve.png"):
        for stale in args.out.glob(pattern):
            stale.unlink()
    (args.work / "logs").mkdir()
    prompt = args.work / "prompt.txt"
    prompt.write_text(PROMPT)
    model = build_model(args.work)
    common = ["-n", str(args.n), "--rounds", str(args.rounds), *policy_args(prompt)]

    runs = {f"{v}-s{s}": (v, s) for v in VARIANTS for s in seeds}
    jobs = [
        (
            "base-val",
            [
                tool("dphil-rollout"),
                "-q",
                "-m",
                f"hf:{rel(model)}",
                "--seeds",
                args.val_seeds,
                "--batch",
                "16",
                *common,
                "-o",
                rel(args.work / "ep-base.jsonl"),
            ],
        )
    ]
    for name, (variant, seed) in runs.items():
        jobs.append(
            (
                name,
                [
                    tool("dphil-train"),
                    "--backend",
                    "peft",
                    "--base-model",
                    rel(model),
                    "--run-dir",
                    rel(args.work / f"run-{name}"),
                    "--run",
                    name,
                    "--reward",
                    variant,
                    "--seed",
                    str(seed),
                    "--steps",
                    str(args.steps),
                    "--groups",
                    str(args.groups),
                    "--group-size",
                    str(args.group_size),
                    "--lr",
                    str(args.lr),
                    "--micro-batch",
                    "96",
                    "--val-every",
                    str(args.val_every),
                    "--val-seeds",
                    args.val_seeds,
                    *common,
                    "--episodes-out",
                    rel(args.work / f"ep-{name}.jsonl"),
                    "-o",
                    rel(args.work / f"ckpts-{name}.jsonl"),
                ],
            )
        )
    # Longest first: the training runs, then the short baseline.
    took = run_jobs(jobs[1:] + jobs[:1], args.jobs, args.work / "logs")

    # Every episode scored under both yardsticks, then summarised per step by dphil-stats.
    for name in ["base", *runs]:
        for y in VARIANTS:
            check(
                [
                    tool("dphil-score"),
                    "-q",
                    "--reward",
                    y,
                    rel(args.work / f"ep-{name}.jsonl"),
                    "-o",
                    rel(args.work / f"ep-{name}.{y}.jsonl"),
                ]
            )
    base = {y: cells(args.work / f"ep-base.{y}.jsonl", "model")[0] for y in VARIANTS}

    summary: dict = {
        "command": "python bench/train_curve.py " + " ".join(sys.argv[1:]),
        "setup": {
            "model": "tests/support/tinymodel.py build_tiny_model (random Qwen3, hidden 96, 2 layers) "
            "+ the 4 multi-token action names added as single tokens",
            "n": args.n,
            "rounds": args.rounds,
            "steps": args.steps,
            "groups": args.groups,
            "group_size": args.group_size,
            "lr": args.lr,
            "lora_rank": 8,
            "seeds": seeds,
            "val_every": args.val_every,
            "val_seeds": args.val_seeds,
            "prompt": PROMPT,
            "decode": "constrained",
            "memory": "none",
            "x_axis": "adapter step: training episodes of step k are played with adapter k-1; "
            "validation at step k with adapter k; step 0 is the base model",
        },
        "base_val": {
            y: {
                "reward": base[y]["reward_mean"],
                "meals": base[y]["meals_mean"],
                "deadlock_rate": base[y]["deadlock_rate"],
            }
            for y in VARIANTS
        },
        "runs": {},
    }
    for name, (variant, seed) in runs.items():
        ckpts = read_jsonl(args.work / f"ckpts-{name}.jsonl")
        scored = {y: cells(args.work / f"ep-{name}.{y}.jsonl", "split,checkpoint_step") for y in VARIANTS}
        own = scored[variant]
        chosen = json.loads(
            check(
                [
                    tool("dphil-ckpt-select"),
                    "-q",
                    "--by",
                    "val",
                    "--run",
                    name,
                    rel(args.work / f"ckpts-{name}.jsonl"),
                    rel(args.work / f"ep-{name}.{variant}.jsonl"),
                ]
            )
        )
        sel, best = chosen["selection"], chosen["step"]
        last = sel["last_step"]
        val_meals = per_step(own, "val", "meals_mean")
        val_dl = per_step(own, "val", "deadlock_rate")
        summary["runs"][name] = {
            "train_reward": variant,
            "seed": seed,
            "seconds": round(took[name]),
            "train": {
                "reward_own": per_step(own, "train", "reward_mean"),
                "reward_paper": per_step(scored["paper"], "train", "reward_mean"),
                "reward_shaped": per_step(scored["shaped"], "train", "reward_mean"),
                "meals": per_step(own, "train", "meals_mean"),
                "deadlock_rate": per_step(own, "train", "deadlock_rate"),
                "zero_std_groups": {r["step"] - 1: r["zero_std_groups"] for r in ckpts},
            },
            "val": {
                "reward_own": per_step(own, "val", "reward_mean"),
                "reward_paper": per_step(scored["paper"], "val", "reward_mean"),
                "meals": val_meals,
                "deadlock_rate": val_dl,
            },
            "selection": {
                "by": "val",
                "metric": f"reward ({variant})",
                "best_step": best,
                "best_score": sel["score"],
                "best_ci": sel["ci"],
                "last_step": last,
                "last_score": sel["last_score"],
                "last_rank": sel["last_rank"],
                "candidates": sel["candidates"],
                "cost_of_keeping_last": sel["score"] - sel["last_score"],
                "best_val_meals": val_meals[best],
                "last_val_meals": val_meals[last],
                "best_val_deadlock_rate": val_dl[best],
                "last_val_deadlock_rate": val_dl[last],
            },
        }
    summary["by_reward"] = aggregate(summary["runs"], args.steps)
    summary["seconds_total"] = round(time.monotonic() - t0)
    # The small artefacts the README cites: checkpoint records (all seeds of a reward in one
    # file; `run` tells them apart), the selections, the numbers and the plot.
    for variant in VARIANTS:
        with (args.out / f"ckpts-{variant}.jsonl").open("w") as f:
            for name, (v, _) in runs.items():
                if v == variant:
                    f.write((args.work / f"ckpts-{name}.jsonl").read_text())
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary, args, args.out / "train_curve.png")
    print(json.dumps(summary["by_reward"], indent=1))
    print(f"total {summary['seconds_total']}s", file=sys.stderr)


if __name__ == "__main__":
    main()
