"""The dphil command lines the recipe experiment runs: its model, training, selection and test rollouts.

Built from the size and the options alone (bench/recipes.py decides what runs when): a job is
None when its output is already complete, so a restarted experiment carries on. Only what a
command line must name is made here: the model (dphil-weights, or the tiny model built once),
the prompt file and a selection (dphil-ckpt-select).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from jobs import check, rel, tool
from recipes_plan import expand
from recipes_work import atomic_write, complete_lines, journal
from single_token_model import PROMPT, build_model, policy_args


class Commands:
    """One experiment's commands: `args` its options, `size` its SIZES entry, `work` its work directory."""

    def __init__(self, args: argparse.Namespace, size: dict, work: Path) -> None:
        self.args = args
        self.size = size
        self.work = work

    def model(self) -> str:
        if self.args.gpu:
            return self.args.base_model
        if self.args.real:  # dphil-weights assembles, verifies and converts it once
            return (
                self.args.base_model
                or check([tool("dphil-weights"), "-q", "--model", "qwen2.5-coder-0.5b-instruct"]).strip()
            )
        final = self.work / "tiny-model"
        if not (final / "config.json").exists():
            staging = self.work / "model-staging"
            built = build_model(staging)
            os.replace(built, final)  # the model directory appears whole or not at all
        return rel(final)

    def common(self) -> list[str]:
        """Table and policy options shared by training and evaluation."""
        s = self.size
        # a built-in prompt other than the default is named; earlier parts' command lines stay as they ran
        prompt = getattr(self.args, "prompt", "default")
        named = ["--prompt", prompt] if prompt != "default" else []
        if self.args.gpu:  # ART generates free text with the built-in prompt and full memory
            return ["--rounds", str(s["rounds"]), *named]
        if self.args.real:  # the study's prompt and memory; choices scored, never misparsed
            return [
                "--rounds",
                str(s["rounds"]),
                "--memory",
                "full",
                "--decode",
                "constrained",
                "--threads",
                "2",
                *named,
            ]
        prompt = self.work / "prompt.txt"
        if not prompt.exists():
            atomic_write(prompt, PROMPT)
        return ["--rounds", str(s["rounds"]), *policy_args(prompt)]

    def train_job(self, name: str, recipe: dict, seed: int, model: str) -> tuple[str, list[str]] | None:
        s = self.size
        run_dir = self.work / f"run-{name}-s{seed}"
        if len(journal(run_dir)) >= s["steps"]:
            return None  # done
        if self.args.gpu:
            backend = ["--backend", "art", "--max-new-tokens", "256"]
        elif self.args.real:
            backend = ["--backend", "peft", "--lr", str(self.args.lr), *self.args.autocast]
        else:
            backend = ["--backend", "peft", "--lr", str(self.args.lr), "--micro-batch", "96"]
        return (
            f"train-{name}-s{seed}",
            [
                tool("dphil-train"),
                "-q",
                *backend,
                "--base-model",
                model,
                "--run-dir",
                rel(run_dir),
                "--run",
                f"{name}-s{seed}",
                "--reward",
                recipe["reward"],
                "--advantage",
                recipe["advantage"],
                *recipe["sizes"],
                "--seed",
                str(seed),
                "--steps",
                str(s["steps"]),
                "--groups",
                str(s["groups"]),
                "--group-size",
                str(s["group_size"]),
                "--val-every",
                str(s["val_every"]),
                "--val-seeds",
                s["val_seeds"],
                "--val-n",
                s.get("n", "3,5"),
                *self.common(),
                "--episodes-out",
                rel(self.work / f"ep-{name}-s{seed}.jsonl"),
                # the default left unnamed: earlier parts' command lines stay as they ran
                *(["--temperature", f"{self.args.temperature:g}"] if self.args.temperature != 1.0 else []),
            ],
        )

    def select(self, recipe: str, rule: str, seed: int) -> Path:
        """dphil-ckpt-select --by val (on the run's validation episodes) or --by last; atomic, once."""
        out = self.work / f"sel-{recipe}-{rule}-s{seed}.jsonl"
        if not out.exists():
            ckpts = self.work / f"run-{recipe}-s{seed}" / "checkpoints.jsonl"
            args = [tool("dphil-ckpt-select"), "-q", "--by", rule, rel(ckpts)]
            if rule == "val":
                args.append(rel(self.work / f"ep-{recipe}-s{seed}.jsonl"))
            check([*args, "-o", rel(out)])
        return out

    def test_job(self, arm: str, source: list[str], path: Path) -> tuple[str, list[str]] | None:
        s = self.size
        sizes = len(s.get("n", "3,5").split(","))
        adapters = len(source) // 2 if source[0] == "--checkpoints" else 1
        expected = sizes * len(expand(s["test_seeds"])) * adapters
        if complete_lines(path) >= expected:
            return None
        # On a GPU the adapters ART trained on free text are evaluated on free text too.
        if self.args.gpu:
            batch = ["--decode", "free"]
        else:
            batch = ["--batch", "6"] if self.args.real else ["--batch", "32", "--threads", "1"]
        return (
            f"test-{arm}-{path.stem}",
            [
                tool("dphil-rollout"),
                "-q",
                *source,
                "--seeds",
                s["test_seeds"],
                "-n",
                s.get("n", "3,5"),
                "--tag",
                f"recipe={arm}",
                *self.common(),
                *batch,
                "-o",
                rel(path),
                "--resume",
            ],
        )
