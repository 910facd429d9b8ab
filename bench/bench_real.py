"""A real language model on this CPU: Gemma 3 270M (base) through dphil's local path.

Every figure comes from the installed commands run as a user runs them, each
under `/usr/bin/time -v` (wall time and peak resident memory of the process):

  hf        dphil-rollout -m hf:DIR, constrained and free decoding, at N=3 and N=5
            (2 episodes, 3 rounds): parse rate (turns with a legal action), null share,
            turns/s, seconds per episode, peak RSS; then a dphil-stats table of the
            model beside the scripted baselines on the same seeds, under both rewards.
  train     dphil-train --backend peft: one step of 1 group of 2 episodes at N=3
            (2 rounds), the same with --no-gradient-checkpointing, and one of a group
            of 4 at N=5 (2 rounds): seconds per step and peak RSS. The published reward
            and seed 1, where the episodes' rewards differ (zero_std_groups 0), so the
            step really runs a backward pass.
  pipeline  a few GRPO steps at N=3 (3 rounds, so a meal is possible) with the shaped
            reward, 1 group of 2 episodes, a checkpoint every step,
            then dphil-rollout --checkpoints on held-out seeds | dphil-score --shaped |
            dphil-ckpt-select --by val.

    dphil-weights && nice -n 10 python bench/bench_real.py [--parts hf,train,pipeline] [--out DIR]

Needs `pip install -e '.[train,real]'` and /usr/bin/time (Debian: apt-get install time).
Results are written as JSON to --out (default bench/results/real) and printed as tables.
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


def tool(name: str) -> str:
    found = locate(name)
    if found is None:
        sys.exit(f"bench_real: {name} is not installed (pip install -e '.[train,real]')")
    return found


def timed(args: list[str], *, stdin: bytes | None = None, threads: int | None = None) -> dict:
    """Run one command under /usr/bin/time -v; its stdout, wall seconds and peak RSS (GB)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        started = time.monotonic()
        proc = subprocess.run(
            ["/usr/bin/time", "-v", "-o", tf.name, tool(args[0]), *args[1:]], input=stdin, capture_output=True, env=env
        )
        wall = time.monotonic() - started
        report = tf.read()
    if proc.returncode != 0:
        sys.exit(f"bench_real: {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1))
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", report))
    return {
        "stdout": proc.stdout,
        "stderr": proc.stderr.decode(),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_gb": round(rss_kb / 1e6, 2),
    }


def records(data: bytes) -> list[dict]:
    return [json.loads(x) for x in data.splitlines() if x.strip()]


def bench_hf(model: str, out: Path) -> list[dict]:
    rows = []
    episodes_all = b""
    for n in (3, 5):
        for decode in ("constrained", "free"):
            run = timed(
                [
                    "dphil-rollout",
                    "-q",
                    "-m",
                    f"hf:{model}",
                    "-n",
                    str(n),
                    "--episodes",
                    "2",
                    "--rounds",
                    "3",
                    "--decode",
                    decode,
                    "--seed",
                    "0",
                ]
            )
            eps = records(run["stdout"])
            turns = [t for e in eps for t in e["turns"]]
            legal = sum(t["action"] is not None for t in turns)
            rows.append(
                {
                    "n": n,
                    "decode": decode,
                    "episodes": len(eps),
                    "turns": len(turns),
                    "parse_rate": round(legal / len(turns), 3),
                    "null_share": round(1 - legal / len(turns), 3),
                    "turns_per_s": round(len(turns) / run["wall_s"], 2),
                    "s_per_episode": round(run["wall_s"] / len(eps), 1),
                    "wall_s": run["wall_s"],
                    "cpu_s": run["cpu_s"],
                    "peak_rss_gb": run["peak_rss_gb"],
                    "completion_tokens": sum(t.get("completion_tokens", 0) for t in turns),
                    "example_raw": next((t["raw"] for t in turns if t["action"] is None), turns[0]["raw"])[:120],
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "example_raw"}), flush=True)
            episodes_all += run["stdout"]
    for n in (3, 5):
        for policy in ("hierarchy", "naive", "random", "idle"):
            episodes_all += timed(
                [
                    "dphil-rollout",
                    "-q",
                    "-m",
                    f"scripted:{policy}",
                    "-n",
                    str(n),
                    "--episodes",
                    "2",
                    "--rounds",
                    "3",
                    "--seed",
                    "0",
                ]
            )["stdout"]
    (out / "hf-episodes.jsonl").write_bytes(episodes_all)
    tables = {}
    for reward in ("paper", "shaped"):
        scored = timed(["dphil-score", "-q", "--reward", reward], stdin=episodes_all)["stdout"]
        tables[reward] = timed(["dphil-stats", "-q", "--by", "model,n,decode", "--format", "markdown"], stdin=scored)[
            "stdout"
        ].decode()
        print(f"\n{reward} reward:\n{tables[reward]}", flush=True)
    (out / "hf-stats.json").write_text(json.dumps(tables, indent=1))
    return rows


def train_step(model: str, run_dir: Path, *, n: int, group_size: int, extra: list[str] = ()) -> dict:
    run = timed(
        [
            "dphil-train",
            "-q",
            "--backend",
            "peft",
            "--base-model",
            model,
            "-n",
            str(n),
            "--rounds",
            "2",
            "--steps",
            "1",
            "--groups",
            "1",
            "--group-size",
            str(group_size),
            "--reward",
            "paper",
            "--seed",
            "1",
            "--run-dir",
            str(run_dir),
            *extra,
        ]
    )
    (ckpt,) = records(run["stdout"])
    return {
        "n": n,
        "groups": 1,
        "group_size": group_size,
        "rounds": 2,
        "s_per_step": ckpt["seconds"],
        "wall_s": run["wall_s"],
        "cpu_s": run["cpu_s"],
        "peak_rss_gb": run["peak_rss_gb"],
        "loss": ckpt.get("loss"),
        "zero_std_groups": ckpt["zero_std_groups"],
        "extra": list(extra),
    }


def bench_train(model: str, work: Path) -> list[dict]:
    rows = []
    for n, size, extra in ((3, 2, []), (3, 2, ["--no-gradient-checkpointing"]), (5, 4, [])):
        rows.append(train_step(model, work / f"train-{n}-{size}-{len(extra)}", n=n, group_size=size, extra=extra))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_pipeline(model: str, work: Path, steps: int = 3) -> dict:
    run_dir = work / "pipeline"
    train = timed(
        [
            "dphil-train",
            "-q",
            "--backend",
            "peft",
            "--base-model",
            model,
            "-n",
            "3",
            "--rounds",
            "3",
            "--steps",
            str(steps),
            "--groups",
            "1",
            "--group-size",
            "2",
            "--shaped",
            "--lr",
            "1e-4",
            "--run-dir",
            str(run_dir),
        ]
    )
    ckpts = run_dir / "ckpts.jsonl"
    ckpts.write_bytes(train["stdout"])
    val = timed(
        ["dphil-rollout", "-q", "--checkpoints", str(ckpts), "--seeds", "1000-1001", "-n", "3", "--rounds", "3"]
    )
    scored = timed(["dphil-score", "-q", "--shaped"], stdin=val["stdout"])
    best = timed(["dphil-ckpt-select", "-q", "--by", "val", str(ckpts), "-"], stdin=scored["stdout"])
    chosen = records(best["stdout"])[0]
    by_step: dict[int, list[float]] = {}
    for r in records(scored["stdout"]):
        by_step.setdefault(r["checkpoint_step"], []).append(r["reward"]["total"])
    result = {
        "train_wall_s": train["wall_s"],
        "train_peak_rss_gb": train["peak_rss_gb"],
        "s_per_step": [c["seconds"] for c in records(train["stdout"])],
        "train_reward": [c["train_reward"] for c in records(train["stdout"])],
        "zero_std_groups": [c["zero_std_groups"] for c in records(train["stdout"])],
        "val_wall_s": val["wall_s"],
        "val_episodes": sum(len(v) for v in by_step.values()),
        "val_reward_by_step": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_step.items())},
        "chosen_step": chosen["step"],
        "selection": chosen["selection"],
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="hf,train,pipeline")
    ap.add_argument("--model", default=None, help="transformers directory [default: what dphil-weights prints]")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real")
    ap.add_argument("--steps", type=int, default=3, help="pipeline: GRPO steps")
    args = ap.parse_args()
    if not Path("/usr/bin/time").exists():
        sys.exit("bench_real: /usr/bin/time is missing (apt-get install time)")
    model = (
        args.model
        or subprocess.run([tool("dphil-weights"), "-q"], capture_output=True, check=True, text=True).stdout.strip()
    )
    args.out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        for part in parts:
            if part == "hf":
                result = bench_hf(model, args.out)
            elif part == "train":
                result = bench_train(model, work)
            elif part == "pipeline":
                result = bench_pipeline(model, work, args.steps)
            else:
                sys.exit(f"bench_real: unknown part {part!r} (hf, train, pipeline)")
            (args.out / f"{part}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
