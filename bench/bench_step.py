"""One GRPO step on a real model, phase by phase: the plain computation against prefix trees and bf16.

Each variant is `dphil-train --backend peft` run as a user runs it, one step, under
`/usr/bin/time -v` (wall time and peak resident memory), on the same seeds, so every variant
plays the same episodes as long as its sampling arithmetic is the same (float32):

  plain     --pack-width 0: every reply scored on its own prompt, as before prefix trees
  tree      the default: a step's replies on prefix-tree rows, each shared prefix once per row (since
            2026-12-06, in this and every later variant, what neighbouring rows share computed once
            for them: --shared-prefix)
  tree-whole  the default with every row computing what it shares with its neighbours (--no-shared-prefix)
  bf16      the default with --autocast bf16 (sampling and training)
  bf16w     the default with the base weights in bfloat16 (--dtype bfloat16; the adapter float32)
  bf16wa    both: bfloat16 weights (no casts while sampling) and autocast (the adapter's products too)
  bf16wa-whole  bf16wa with every row computing what it shares with its neighbours (--no-shared-prefix)
  bf16wa-nockpt  bf16wa keeping the activations (--no-gradient-checkpointing): bfloat16 halves them
  bf16wa-nockpt-whole  the same with every row computing what it shares (--no-shared-prefix)
  bf16wa-nockpt-w1024  bf16wa-nockpt on rows of 1024: narrower shared stems, a mask a quarter the size
  bf16wa-nockpt-w4096  the same on rows of 4096 positions: fewer repeated prefixes, a mask four
            times the size and twice the kept activations per row
  nockpt    rows of 1024 positions, activations kept (--no-gradient-checkpointing): the bare
            decoder trains faster so (bench_machine.py), but narrower rows repeat more prefixes
  bf16wa-nockpt-seatlast  bf16wa-nockpt with --prompt seat-last: every seat's system prompt opens
            alike, so the step computes that opening once (another prompt: other episodes)

The phases come from the step's checkpoint record (`phase_seconds`: rollout, train, save),
the positions the training forward passes computed from `positions`. The plain and tree
variants must give the same gradient (same episodes, same arithmetic; the loss of a step's
one update is the advantages' mean either way): the script prints the gradient norms'
difference. Appends each variant's row to OUT/rows.jsonl as it finishes, then writes OUT/summary.json and
OUT/summary.md from every row of that journal.

    dphil-weights --model qwen2.5-coder-0.5b-instruct   # the transformers directory, once
    nice python bench/bench_step.py [--model DIR] [--variants plain,tree,bf16]
        [-n 5] [--rounds 5] [--groups 2] [--group-size 3] [--out bench/results/step/KIND]

KIND names the CPU's matrix instructions (avx2, avx512, avx512-amx): they decide whether
bfloat16 is fast (bench_machine.py), so each kind of machine keeps its own figures.

The study's step is the default size (2 groups x 3 episodes, N = 5, 5 rounds, LoRA rank 8).
Run under LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 (Debian's libjemalloc2), each
row records the preloaded allocator as `preload`.
Needs `pip install -e '.[train,real]'` and /usr/bin/time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dphil.io.console_scripts import locate

ROOT = Path(__file__).resolve().parent.parent
BF16WA = ["--dtype", "bfloat16", "--autocast", "bf16"]
BF16WA_NOCKPT = [*BF16WA, "--no-gradient-checkpointing"]
VARIANTS = {
    "plain": ["--pack-width", "0"],
    "tree": [],
    "tree-whole": ["--no-shared-prefix"],
    "bf16": ["--autocast", "bf16"],
    "bf16w": ["--dtype", "bfloat16"],
    "bf16wa": BF16WA,
    "bf16wa-whole": [*BF16WA, "--no-shared-prefix"],
    "bf16wa-nockpt": BF16WA_NOCKPT,
    "bf16wa-nockpt-w4096": [*BF16WA_NOCKPT, "--pack-width", "4096"],
    "bf16wa-nockpt-whole": [*BF16WA_NOCKPT, "--no-shared-prefix"],
    "bf16wa-nockpt-w1024": [*BF16WA_NOCKPT, "--pack-width", "1024"],
    "nockpt": ["--pack-width", "1024", "--no-gradient-checkpointing"],
    "bf16wa-nockpt-seatlast": [*BF16WA_NOCKPT, "--prompt", "seat-last"],
}


def tool(name: str) -> str:
    found = locate(name)
    if found is None:
        sys.exit(f"bench_step: {name} is not installed (pip install -e '.[train,real]')")
    return found


def cpu_flags() -> set[str]:
    """The first CPU's feature flags (/proc/cpuinfo); empty where they cannot be read."""
    try:
        return set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        return set()


def cpu_kind() -> str:
    """The CPU's matrix instructions, which decide float32 against bfloat16 (bench_machine.py)."""
    flags = cpu_flags()
    if not flags:
        return "unknown"
    if "amx_bf16" in flags:
        return "avx512-amx"
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"


def step(model: str, variant: str, a: argparse.Namespace, work: Path) -> dict:
    run_dir = work / variant
    args = [tool("dphil-train"), "--backend", "peft", "--base-model", model, "-n", str(a.n)]
    args += ["--rounds", str(a.rounds), "--steps", "1", "--groups", str(a.groups), "--group-size", str(a.group_size)]
    args += ["--lora-rank", "8", "--shaped", "--seed", str(a.seed), "--val-every", "0", "--run-dir", str(run_dir)]
    args += ["--threads", str(a.threads), "-q", *VARIANTS[variant]]
    timing = work / f"{variant}.time"
    started = time.monotonic()
    proc = subprocess.run(["/usr/bin/time", "-v", "-o", str(timing), *args], capture_output=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"bench_step: {variant} failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
    report = timing.read_text()
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1))
    (record,) = [json.loads(x) for x in (run_dir / "checkpoints.jsonl").read_text().splitlines() if x.strip()]
    return {
        "variant": variant,
        "cpu": cpu_kind(),
        "wall_s": round(wall, 1),
        "step_s": record["seconds"],
        **{f"{k}_s": v for k, v in record["phase_seconds"].items()},
        "positions": int(record.get("positions", 0)),
        "peak_rss_gb": round(rss_kb / 1e6, 2),
        "loss": record["loss"],
        "grad_norm": record["grad_norm"],
        "train_reward": record["train_reward"],
        "trained_samples": int(record["trained_samples"]),
        "seed": a.seed,  # another seed plays other episodes
        "arithmetic": record.get("arithmetic"),
        # A memory allocator preloaded into the step (LD_PRELOAD), which changes its speed, not its values.
        "preload": Path(os.environ["LD_PRELOAD"]).name if os.environ.get("LD_PRELOAD") else None,
    }


def markdown(rows: list[dict], a: argparse.Namespace) -> str:
    head = "| variant | step s | rollout s | train s | save s | positions | peak RSS GB | loss | grad norm |"
    out = [
        f"One step: {a.groups} groups x {a.group_size} episodes, N = {a.n}, {a.rounds} rounds, LoRA rank 8, "
        f"{a.threads} threads, seed {a.seed} unless a row names another.",
        "",
        head,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        name = r["variant"] + (f" under {r['preload']}" if r.get("preload") else "")
        name += f", seed {r['seed']}" if r.get("seed", a.seed) != a.seed else ""
        name += f" ({r['code']})" if r.get("code") else ""
        out.append(
            f"| {name} | {r['step_s']:.0f} | {r['rollout_s']:.0f} | {r['train_s']:.0f} | {r['save_s']:.1f} "
            f"| {r['positions']} | {r['peak_rss_gb']} | {r['loss']:.6f} | {r['grad_norm']:.4f} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a transformers directory (default: dphil-weights' Qwen 0.5B)")
    p.add_argument("--variants", default="plain,tree,bf16")
    p.add_argument("-n", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step" / cpu_kind())
    a = p.parse_args()
    model = a.model
    if model is None:
        got = subprocess.run(
            [tool("dphil-weights"), "--model", "qwen2.5-coder-0.5b-instruct", "-q"], capture_output=True, check=True
        )
        model = got.stdout.decode().strip()
    rows = []
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        for variant in a.variants.split(","):
            rows.append(step(model, variant, a, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
            with (a.out / "rows.jsonl").open("a") as journal:  # each variant kept as it finishes
                journal.write(json.dumps(rows[-1]) + "\n")
    by = {r["variant"]: r for r in rows}
    if "plain" in by and "tree" in by:
        gap = abs(by["tree"]["grad_norm"] - by["plain"]["grad_norm"]) / by["plain"]["grad_norm"]
        print(f"bench_step: grad norm tree vs plain: relative difference {gap:.2e}")
    print(markdown(rows, a))
    write_summary(a, model)
    return 0


def write_summary(a: argparse.Namespace, model: str) -> None:
    """summary.json and summary.md from every row the journal holds, so a later run of one
    variant adds to the summary instead of replacing it."""
    rows = [json.loads(line) for line in (a.out / "rows.jsonl").read_text().splitlines() if line.strip()]
    (a.out / "summary.json").write_text(json.dumps({"model": model, "rows": rows}, indent=1) + "\n")
    (a.out / "summary.md").write_text(markdown(rows, a))


if __name__ == "__main__":
    sys.exit(main())
