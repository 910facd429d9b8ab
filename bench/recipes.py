"""The recipe experiment: can a better recipe close the gap the study's could not?

Recipes at the same budget (steps x groups x group size, the same training
seeds), each trained with `dphil-train --backend peft` on the test suite's tiny
random Qwen3 (see bench/train_curve.py for why its action names are made
single tokens), then evaluated on held-out test seeds at N=3 and N=5:

    study      paper reward, --advantage episode, N=5 fixed, the last checkpoint
    dphil      shaped reward, the better of philosopher/step on VALIDATION (or --credit),
               --curriculum 3:S/2,5:S/2, the checkpoint dphil-ckpt-select --by val keeps
    ablations  dphil with one ingredient changed: the other advantage mode,
               episode advantage, paper reward, N=5 fixed, the last checkpoint
    base       the untrained model

Everything goes through the project's commands, as subprocesses:
dphil-train (checkpoints, validation episodes), dphil-ckpt-select (--by val or
--by last), dphil-rollout --checkpoints --tag recipe=ARM on the test seeds,
dphil-score (shaped and paper yardsticks), dphil-stats --compare recipe ...
--format markdown. Training seeds, validation seeds and test seeds are
disjoint (checked against every checkpoint record's train_seeds).

Resumable: every training run resumes in its own run directory (dphil-train's
journal), every rollout is a `-o FILE --resume` journal, every selection,
score and choice is written atomically and skipped when present. Stopped and
restarted, the same command carries on. Work files go to bench/out/recipes
(not committed); tables, plots and summary.json to bench/results/recipes (a
smoke run keeps them in its work directory). What a later part needs of the
work files, except adapters (the runs' journals and settings, the selections,
the test episodes, the credit-mode choice, the parts' times), is kept gzipped in
RESULTS/work/ after every phase and committed with the results; a fresh work
directory (another machine) is filled from it, so a later part adds seeds
without training the earlier ones again (unless it must play an earlier run's
adapter it lacks, which it names).

    nice -n 5 python bench/recipes.py                   # full size (see --help for the sizes)
    python bench/recipes.py --smoke                     # end to end in a few minutes (CI)
    nice python bench/recipes.py --real [--seeds 0]     # Qwen2.5-Coder-0.5B-Instruct on the CPU
    nice python bench/recipes.py --real --temperature 1.5 --seeds 0   # every recipe trained sampling hotter
    nice python bench/recipes.py --real --temperature 1.5 --credit step --seeds 0   # credit fixed in advance
    nice python bench/recipes.py --real --prompt seat-last --seeds 0   # the prompt whose step is fastest

--real trains the real instruction-tuned model dphil-weights assembles (or --base-model DIR)
at the study's step size (2 groups x 3 episodes, N = 5, 5 rounds, the built-in prompt, full
memory, constrained decoding), in bfloat16 where the CPU multiplies it natively; fewer
steps and test episodes than the study, as the CPU budget forces (SIZES["real"]). Each
training seed is a part: `--seeds 0`, then `--seeds 0,1`, ... resume and add to the same work
directory; the report covers the seeds whose runs are complete.
    python bench/recipes.py --gpu --base-model Qwen/Qwen3-14B   # ART on a GPU (not run here)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import cpu_flags
from jobs import ROOT, check, read_jsonl, rel, run_jobs, tool
from recipes_commands import Commands
from recipes_plan import ABLATIONS, SIZES, arms, expand, recipes, test_file
from recipes_report import curve, digest, plot_curves
from recipes_work import archive, atomic_write, journal, restore

from dphil.agents.prompts import PROMPT_VARIANTS


class Experiment:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.size = SIZES[args.size]
        # each seed once: a seed given twice would count twice in the choice and the report
        self.seeds = list(dict.fromkeys(int(s) for s in (args.seeds or self.size["seeds"]).split(",")))
        self.logged = False  # this invocation's line in parts.jsonl is written
        text = self.size["ablations"] if args.ablations is None else args.ablations
        self.ablations = {a for a in text.split(",") if a and a != "none"}
        unknown = self.ablations - set(ABLATIONS)
        if unknown:
            sys.exit(f"--ablations: unknown {', '.join(sorted(unknown))} (known: {', '.join(ABLATIONS)})")
        self.work: Path = args.work
        self.out: Path = args.out
        self.logs = self.work / "logs"
        for d in (self.work, self.out, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        self.commands = Commands(args, self.size, self.work)
        # Committed beside the results: what a later part (on another machine) resumes from.
        self.kept = self.out / "work"
        if restored := restore(self.kept, self.work):
            say(f"{len(restored)} work file(s) restored from {rel(self.kept)} (adapters are not kept)")

    # -- the experiment --------------------------------------------------------------------------
    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self._run(t0)
        finally:  # a stopped invocation's time counts too (the report logs a finished one's)
            if not self.logged:
                self.log_part(time.monotonic() - t0, stopped=True)
            archive(self.work, self.kept)

    def log_part(self, seconds: float, *, stopped: bool = False) -> None:
        """One whole line a invocation in parts.jsonl: the experiment's time is their sum."""
        line = {"seeds": self.seeds, "seconds": round(seconds), "ended": time.time(), "stopped": stopped}
        with open(self.work / "parts.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")
        self.logged = True

    def _run(self, t0: float) -> None:
        done = self.work / "choice.json"
        ran = json.loads(done.read_text()).get("seeds", []) if done.exists() else []
        if not set(ran) <= set(self.seeds):
            # the test journals hold the episodes of every seed run so far; the report reads them whole
            sys.exit(f"--seeds {','.join(map(str, self.seeds))} leaves out seeds already run ({ran}): seeds only grow")
        model = self.commands.model()
        # one ART trainer per GPU; a real model's command uses both cores
        width = 1 if self.args.gpu or self.args.real else self.args.jobs
        # Phase 1: the recipes that do not depend on the validation choice, and the base model.
        first = recipes(self.size["steps"], None, self.ablations, self.args.credit)
        jobs = [
            j
            for name, r in first.items()
            for seed in self.seeds
            if (j := self.commands.train_job(name, r, seed, model))
        ]
        base_path = self.work / "test-base.jsonl"
        if j := self.commands.test_job("base", ["-m", f"hf:{model}"], base_path):
            jobs.append(j)
        say(f"phase 1: {len(jobs)} job(s)")
        run_jobs(jobs, width, self.logs)
        archive(self.work, self.kept)
        # The better credit assignment, on validation only (never the test seeds).
        best = self.choose()
        full = recipes(self.size["steps"], best, self.ablations, self.args.credit)
        jobs = [
            j
            for name, r in full.items()
            if r.get("after_choice")
            for seed in self.seeds
            if (j := self.commands.train_job(name, r, seed, model))
        ]
        how = "fixed by --credit" if self.args.credit != "val" else "chosen on validation"
        say(f"phase 2 (advantage {how}: {best}): {len(jobs)} job(s)")
        run_jobs(jobs, width, self.logs)
        archive(self.work, self.kept)
        self.check_seeds(full)
        # Phase 3: selections and the test rollouts of every arm.
        jobs = []
        arm_files: dict[str, Path] = {"base": base_path}
        for arm, (recipe, rule) in arms(best, self.ablations).items():
            sels = [self.commands.select(recipe, rule, seed) for seed in self.seeds]
            path = self.work / test_file(arm, best)  # names the mode where the arm plays it
            source = [x for sel in sels for x in ("--checkpoints", rel(sel))]
            if j := self.commands.test_job(arm, source, path):
                self.check_adapters(recipe, sels)
                jobs.append(j)
            arm_files[arm] = path
        say(f"phase 3: {len(jobs)} test rollout(s)")
        run_jobs(jobs, width, self.logs)
        self.report(best, full, arm_files, time.monotonic() - t0)

    def choose(self) -> str:
        """philosopher or step: the higher mean validation score of the checkpoints --by val keeps.

        Chosen over the training seeds this invocation covers, and chosen again whenever they
        change (a later part adds a seed): a choice frozen after the first seed would rest on
        one run. Only validation episodes enter it, never test ones. A tie goes to philosopher
        and says so. The arms that play the chosen mode keep their runs and test episodes per
        mode (recipes_plan.BY_MODE: test-dphil-MODE.jsonl, ...), so a changed choice runs that
        mode's rollouts and loses none of the other's.
        """
        path = self.work / "choice.json"
        seeds = sorted(self.seeds)
        old = json.loads(path.read_text()) if path.exists() else None
        fixed = self.args.credit != "val"
        if old and old.get("fixed", False) != fixed:
            was = "fixed" if old.get("fixed") else "chosen on validation"
            sys.exit(f"{rel(path)}: this work directory's credit mode was {was}; another --credit needs its own --work")
        if fixed:  # chosen before this experiment (its reason in the report), never on its episodes
            atomic_write(
                path,
                json.dumps(
                    {
                        "advantage": self.args.credit,
                        "fixed": True,
                        "seeds": seeds,
                        "how": "fixed in advance by --credit",
                    }
                )
                + "\n",
            )
            return self.args.credit
        if old and old.get("seeds") == seeds:
            return old["advantage"]
        legacy = self.work / "test-dphil.jsonl"
        if old and "seeds" not in old and legacy.exists():  # a work directory from before modes named files
            os.replace(legacy, self.work / test_file("dphil", old["advantage"]))
        scores = {}
        for mode in ("philosopher", "step"):
            picked = [read_jsonl(self.commands.select(f"dphil-{mode}", "val", seed))[0] for seed in seeds]
            scores[mode] = mean(p["selection"]["score"] for p in picked)
        top = max(scores.values())
        tied = [m for m in ("philosopher", "step") if scores[m] == top]
        best = tied[0]
        earlier = [*old.pop("earlier", []), old] if old else []
        atomic_write(
            path,
            json.dumps(
                {
                    "advantage": best,
                    "val_scores": scores,
                    "seeds": seeds,
                    "tie": len(tied) > 1,
                    "how": "mean over the training seeds of the validation score (shaped reward) of the "
                    "checkpoint --by val keeps; a tie goes to philosopher; chosen again when the seeds change",
                    "earlier": earlier,
                }
            )
            + "\n",
        )
        if old and old["advantage"] != best:
            say(f"the credit mode changes from {old['advantage']} to {best} over seeds {seeds}: {scores}")
        return best

    def check_adapters(self, recipe: str, sels: list[Path]) -> None:
        """Test rollouts still to play need the selected adapters, which only the machine that
        trained them has (the committed work files keep journals, not weights): say which run
        to train again rather than let every rollout fail."""
        for seed, sel in zip(self.seeds, sels, strict=True):
            rec = read_jsonl(sel)[0]
            run_dir = self.work / f"run-{recipe}-s{seed}"
            adapter = run_dir / rec["path_in_run"] if "path_in_run" in rec else Path(rec["path"])
            if not adapter.is_dir():
                sys.exit(
                    f"{rel(adapter)}: the adapter {recipe} seed {seed} selected is not here (its journal was "
                    f"restored from {rel(self.kept)} without weights); to play its test episodes, train the run "
                    f"again: remove {rel(run_dir)} and {rel(sel)} and rerun"
                )

    def check_seeds(self, full: dict) -> None:
        val, test = set(expand(self.size["val_seeds"])), set(expand(self.size["test_seeds"]))
        assert not val & test, "validation and test seeds overlap"
        for name in full:
            for seed in self.seeds:
                for rec in journal(self.work / f"run-{name}-s{seed}"):
                    trained = set(rec["train_seeds"])
                    assert not trained & (val | test), f"{name}-s{seed}: a training seed is held out"

    # -- results ---------------------------------------------------------------------------------
    def report(self, best: str, full: dict, arm_files: dict[str, Path], seconds: float) -> None:
        order = ["base", "study", "dphil", *[a for a in arm_files if a.startswith("abl-")]]
        compares = [
            ("base", "study"),
            ("base", "dphil"),
            ("study", "dphil"),
            *[("dphil", a) for a in order if a.startswith("abl-")],
        ]
        summary: dict = {
            "command": "python bench/recipes.py " + " ".join(sys.argv[1:]),
            "size": self.size,
            "seeds": self.seeds,
            "advantage_choice": json.loads((self.work / "choice.json").read_text()),
            "recipes": full,
            "arms": {a: list(v) for a, v in arms(best, self.ablations).items()},
            "model": self.commands.model()
            if self.args.gpu or self.args.real
            else "tests/support/tinymodel.py tiny random Qwen3 + single-token action names (bench/train_curve.py)",
            "lr": self.args.lr,
            "temperature": {"training": self.args.temperature, "test": 1.0},
            "prompt": self.args.prompt,
            "seconds": round(seconds),  # this invocation's; the parts' sum below
        }
        self.log_part(seconds)
        summary["parts"] = read_jsonl(self.work / "parts.jsonl")
        summary["seconds_total"] = sum(part["seconds"] for part in summary["parts"])
        for yardstick in ("shaped", "paper"):
            # scored afresh each time: a later part (another training seed) adds test episodes
            scored = self.work / f"test-all.{yardstick}.jsonl"
            check(
                [
                    tool("dphil-score"),
                    "-q",
                    "--reward",
                    yardstick,
                    *[rel(arm_files[a]) for a in order],
                    "-o",
                    rel(scored),
                ]
            )
            # --cluster run: a trained arm's episodes come from a few training runs (its units)
            args = [tool("dphil-stats"), "-q", rel(scored), "--by", "recipe,n", "--cluster", "run"]
            for a, b in compares:
                args += ["--compare", "recipe", a, b]
            table = check([*args, "--format", "markdown"])
            atomic_write(self.out / f"table-{yardstick}.md", table)
            records = [json.loads(line) for line in check(args).splitlines()]
            atomic_write(self.out / f"stats-{yardstick}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
            summary[yardstick] = digest(records)
        summary["training"] = {
            name: {f"s{seed}": curve(journal(self.work / f"run-{name}-s{seed}")) for seed in self.seeds}
            for name in full
        }
        summary["selected_steps"] = {
            arm: [read_jsonl(self.commands.select(recipe, rule, seed))[0]["step"] for seed in self.seeds]
            for arm, (recipe, rule) in arms(best, self.ablations).items()
        }
        atomic_write(self.out / "summary.json", json.dumps(summary, indent=1) + "\n")
        plot_curves(summary, self.out)
        say(f"done in {seconds:.0f}s: {rel(self.out)}")
        print((self.out / "table-shaped.md").read_text())


# -- small helpers --------------------------------------------------------------------------------


def say(msg: str) -> None:
    print(f"[recipes {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def native_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 matrices natively (AMX or AVX-512 BF16): 6x float32 then."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="A tiny size that runs end to end in minutes.")
    ap.add_argument(
        "--gpu", action="store_true", help="ART on a CUDA GPU at the study's sizes (needs openpipe-art[backend])."
    )
    ap.add_argument(
        "--real", action="store_true", help="Qwen2.5-Coder-0.5B-Instruct on the CPU (peft) at the 'real' size."
    )
    ap.add_argument(
        "--base-model",
        default=None,
        help="--gpu: the model to train [Qwen/Qwen3-14B]; --real: a transformers directory [dphil-weights' Qwen 0.5B].",
    )
    ap.add_argument("--seeds", default=None, help="Training seeds (comma list) [default: per size].")
    ap.add_argument(
        "--ablations",
        default=None,
        metavar="LIST",
        help=f"Ablation arms, from {','.join(ABLATIONS)} or none [default: all; smoke: other,last; real: none].",
    )
    ap.add_argument("--lr", type=float, default=None, help="peft learning rate [tiny model 3e-3; --real 1e-4].")
    ap.add_argument(
        "--autocast",
        choices=("auto", "bf16", "none"),
        default="auto",
        help="--real: train in bfloat16, activations kept (auto: where the CPU has bfloat16 instructions).",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="Sampling temperature of every recipe's training and validation episodes (dphil-train "
        "--temperature); test episodes sample at 1.0. Another value keeps its own work and results "
        "directories (-tT) [1.0].",
    )
    ap.add_argument(
        "--prompt",
        choices=PROMPT_VARIANTS,
        default="default",
        help="--real, --gpu: the built-in prompt every episode plays, training and test; another than "
        "the default keeps its own work and results directories (-pNAME) [default].",
    )
    ap.add_argument(
        "--credit",
        choices=("val", "philosopher", "step"),
        default="val",
        help="The dphil arm's credit mode: chosen on validation between philosopher and step (val), or "
        "fixed in advance, so the other mode is not trained unless the 'other' ablation asks [val].",
    )
    ap.add_argument("--jobs", type=int, default=2, help="Commands in parallel (1 thread each).")
    ap.add_argument("--work", type=Path, default=None, help="Work files [bench/out/recipes[-smoke]].")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Tables, plots, summary [bench/results/recipes[-gpu,-real]; smoke: WORK/results].",
    )
    args = ap.parse_args()
    if args.smoke + args.gpu + args.real > 1:
        ap.error("--smoke, --gpu and --real are different sizes")
    args.size = "smoke" if args.smoke else "gpu" if args.gpu else "real" if args.real else "full"
    if args.gpu and args.base_model is None:
        args.base_model = "Qwen/Qwen3-14B"
    if args.lr is None:
        args.lr = 1e-4 if args.real else 3e-3
    bf16 = args.autocast == "bf16" or (args.autocast == "auto" and native_bf16())
    # The fastest step measured on such a CPU (docs/training.md); float32 and checkpointing elsewhere.
    args.autocast = ["--dtype", "bfloat16", "--autocast", "bf16", "--no-gradient-checkpointing"] if bf16 else []
    # SIGTERM (kill, scancel) unwinds like Ctrl-C, so the running commands are stopped with us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.temperature > 0:
        ap.error("--temperature must be above 0")
    if args.prompt != "default" and not (args.real or args.gpu):
        ap.error("--prompt: the tiny model plays its own prompt file (bench/single_token_model.py)")
    args.work, args.out = directories(args)
    Experiment(args).run()


def directories(args: argparse.Namespace) -> tuple[Path, Path]:
    """(work, results): the options' or the size's own, and a training temperature's own.

    dphil-train refuses to resume a run at another temperature or prompt, and a table must not mix two.
    """
    tag = {"full": ""}.get(args.size, f"-{args.size}")
    if args.temperature != 1.0:
        tag += f"-t{args.temperature:g}"
    if getattr(args, "prompt", "default") != "default":
        tag += f"-p{args.prompt}"
    work = args.work or ROOT / "bench" / "out" / f"recipes{tag}"
    # Only the full size's results are committed; a smoke run's stay with its work files.
    out = args.out or (work / "results" if args.smoke else ROOT / "bench" / "results" / f"recipes{tag}")
    return work, out


if __name__ == "__main__":
    main()
