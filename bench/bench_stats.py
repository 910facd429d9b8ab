"""Benchmark: dphil-stats over a million scored episodes vs a plain polars read of the file.

    python bench/bench_stats.py                   # 1,000,000 episodes (about 2.5 GB on disk)
    python bench/bench_stats.py --episodes 100000 --keep /tmp/ep.jsonl

The file is built from real scored episodes (scripted policies played by the engine
and scored by dphil.scoring), replicated under fresh seeds and four model names so
the run has 8 cells and 2 seed-paired comparisons. Both sides run as fresh processes,
so both pay their imports: the baseline is `polars.read_ndjson(FILE)` with polars'
own schema inference; dphil-stats reads, checks, groups, tests and writes records.
Target: dphil-stats under twice the plain read.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import orjson

POLICIES = ("hierarchy", "random", "greedy", "naive")
POOL_SEEDS = 250


def build(path: str, episodes: int) -> None:
    from dphil.episode import play
    from dphil.policies import get_policy
    from dphil.records import EpisodeConfig
    from dphil.reward import RewardSpec
    from dphil.scoring import score_record

    spec = RewardSpec()
    pool: list[dict] = []
    for policy in POLICIES:
        for n in (5, 10):
            for seed in range(POOL_SEEDS):
                config = EpisodeConfig(model=f"scripted:{policy}", n=n, seed=seed)
                pool.append(score_record(play(config, get_policy(policy)), spec))
    per_cell = POOL_SEEDS
    cells = len(pool) // per_cell
    dumps = orjson.dumps
    with open(path, "wb") as fh:
        chunk: list[bytes] = []
        for k in range(episodes):
            cell, j = k % cells, (k // cells)
            record = pool[cell * per_cell + j % per_cell]
            record["seed"] = j  # seeds shared across models: comparisons pair by seed
            chunk.append(dumps(record))
            if len(chunk) == 10_000:
                fh.write(b"\n".join(chunk) + b"\n")
                chunk.clear()
        if chunk:
            fh.write(b"\n".join(chunk) + b"\n")


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    res = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {' '.join(argv)}\n{res.stderr.decode()}")
    return elapsed


def stats_command() -> list[str]:
    exe = shutil.which("dphil-stats", path=os.path.dirname(sys.executable))
    if exe:
        return [exe]
    return [sys.executable, "-c", "from dphil.commands.stats import main; main()"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--keep", metavar="FILE", help="build (or reuse) the episodes at FILE")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many runs each")
    args = ap.parse_args()

    tmpdir = None
    if args.keep:
        path = args.keep
    else:
        tmpdir = tempfile.mkdtemp(prefix="dphil-bench-")
        path = os.path.join(tmpdir, "episodes.jsonl")
    try:
        if not os.path.exists(path):
            start = time.perf_counter()
            build(path, args.episodes)
            print(f"built {args.episodes:,} scored episodes ({os.path.getsize(path) / 1e9:.2f} GB) "
                  f"in {time.perf_counter() - start:.1f} s", flush=True)
        plain = [sys.executable, "-c", "import sys, polars; polars.read_ndjson(sys.argv[1])", path]
        ours = [*stats_command(), path, "-q", "-o", os.devnull,
                "--compare", "model", "scripted:naive", "scripted:hierarchy"]
        t_plain = min(timed(plain) for _ in range(args.repeat))
        print(f"plain polars.read_ndjson: {t_plain:7.2f} s", flush=True)
        t_ours = min(timed(ours) for _ in range(args.repeat))
        print(f"dphil-stats             : {t_ours:7.2f} s")
        print(f"ratio                   : {t_ours / t_plain:7.2f}x (target < 2x)")
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)


if __name__ == "__main__":
    main()
