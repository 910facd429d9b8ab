"""The published recipe through OpenPipe ART, sized to finish in under ten minutes on one GPU.

Run on a CUDA machine with `pip install -e '.[art]' 'openpipe-art[backend]==0.5.18'`:

    python bench/art_recipe.py --base-model Qwen/Qwen3-0.6B      # or a local model directory

It runs `dphil-train --backend art` (LoRA rank 8, N=5, 5 rounds, groups of 3)
for a few steps, then checks what the study's recipe needs: one checkpoint
record per step, each naming an adapter directory that exists on disk. The
full study is the same command with `--base-model Qwen/Qwen3-14B --steps 16`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dphil.io.console_scripts import locate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-model", default="Qwen/Qwen3-0.6B")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--run-dir", type=Path, default=Path("bench/out/art-recipe"))
    ap.add_argument("--timeout", type=int, default=570)
    args = ap.parse_args()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    cmd = [
        locate("dphil-train") or sys.exit("art_recipe: dphil-train is not installed: pip install -e '.[art]'"),
        "--backend",
        "art",
        "--base-model",
        args.base_model,
        "-n",
        "5",
        "--rounds",
        "5",
        "--steps",
        str(args.steps),
        "--groups",
        "2",
        "--group-size",
        "3",
        "--lora-rank",
        "8",
        "--run-dir",
        str(args.run_dir),
        "--max-new-tokens",
        "256",
        "--shaped",
    ]
    print(" ".join(cmd), file=sys.stderr)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0:
        sys.exit(f"dphil-train --backend art failed with exit {proc.returncode}")
    records = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    assert [r["step"] for r in records] == list(range(1, args.steps + 1)), records
    for r in records:
        assert r["backend"] == "art" and r["lora_rank"] == 8
        assert Path(r["path"]).is_dir(), f"step {r['step']}: no adapter at {r['path']}"
    print(
        json.dumps(
            {
                "seconds": round(time.monotonic() - started, 1),
                "train_reward": [r["train_reward"] for r in records],
                "zero_std_groups": [r["zero_std_groups"] for r in records],
                "adapters": [r["path"] for r in records],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
