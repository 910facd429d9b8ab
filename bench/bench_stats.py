"""Benchmark: dphil-stats over a million scored episodes vs a plain polars read of the file.

    python bench/bench_stats.py                   # 1,000,000 episodes (about 2.5 GB on disk)
    python bench/bench_stats.py --episodes 100000 --keep /tmp/ep.jsonl

The file is built from real scored episodes (scripted policies played by the engine
and scored by dphil.scoring.score), replicated under fresh seeds and four model names so
the run has 8 cells and 2 seed-paired comparisons. Both sides run as fresh processes,
so both pay their imports: the baseline is `polars.read_ndjson(FILE)` with polars'
own schema inference; dphil-stats reads, checks, groups, tests and writes records.
Target: dphil-stats under twice the plain read.

    python bench/bench_stats.py --episodes 120000 --html --cell-major --repeat 3

`--html` also times `--format html` (the report page with 3 timelines per cell)
against the same command writing records, alternating them, with each run's peak
memory: what keeping a few whole episodes per cell costs. `--cell-major` writes the
file cell after cell (as a grid from dphil-rollout is), the worst order for finding
the first episodes of the last cell.
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

from dphil.io.console_scripts import locate

POLICIES = ("hierarchy", "random", "greedy", "naive")
POOL_SEEDS = 250


def build(path: str, episodes: int, cell_major: bool = False) -> None:
    from dphil.core.episode import play
    from dphil.core.policies import get_policy
    from dphil.core.records import EpisodeConfig
    from dphil.scoring.reward import RewardSpec
    from dphil.scoring.score import score_record

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
        per = -(-episodes // cells)
        for k in range(episodes):
            cell, j = (k // per, k % per) if cell_major else (k % cells, k // cells)
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


def timed_rss(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident memory (MB) of one fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}")
    return elapsed, usage.ru_maxrss / 1024


def stats_command() -> list[str]:
    return [locate("dphil-stats") or sys.exit("bench_stats: dphil-stats is not installed: pip install -e .")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--keep", metavar="FILE", help="build (or reuse) the episodes at FILE")
    ap.add_argument("--repeat", type=int, default=1, help="best of this many runs each")
    ap.add_argument("--html", action="store_true", help="time --format html against the records")
    ap.add_argument("--cell-major", action="store_true", help="write the file cell after cell")
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
            build(path, args.episodes, args.cell_major)
            print(
                f"built {args.episodes:,} scored episodes ({os.path.getsize(path) / 1e9:.2f} GB) "
                f"in {time.perf_counter() - start:.1f} s",
                flush=True,
            )
        plain = [sys.executable, "-c", "import sys, polars; polars.read_ndjson(sys.argv[1])", path]
        ours = [
            *stats_command(),
            path,
            "-q",
            "-o",
            os.devnull,
            "--compare",
            "model",
            "scripted:naive",
            "scripted:hierarchy",
        ]
        if args.html:
            html = [
                *stats_command(),
                path,
                "-q",
                "--format",
                "html",
                "-o",
                path + ".html",
                "--compare",
                "model",
                "scripted:naive",
                "scripted:hierarchy",
            ]
            runs: dict[str, list[tuple[float, float]]] = {"records": [], "html": []}
            for _ in range(args.repeat):
                runs["records"].append(timed_rss(ours))
                runs["html"].append(timed_rss(html))
            for name, got in runs.items():
                print(
                    f"dphil-stats {name:8}: {min(t for t, _ in got):7.2f} s best, "
                    f"peak {max(m for _, m in got):7.0f} MB",
                    flush=True,
                )
            size = os.path.getsize(path + ".html") / 1e6
            print(
                f"page: {size:.2f} MB; html/records: "
                f"{min(t for t, _ in runs['html']) / min(t for t, _ in runs['records']):.2f}x"
            )
            os.unlink(path + ".html")
            return
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
