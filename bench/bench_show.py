"""dphil-show on a big file: how soon the first page appears, and what it costs in memory.

Generates 100,000 scored scripted episodes (a mix of policies: deadlocks,
conflicts, meals and null actions all occur), then runs the installed command
as a real process, timed from start-up to its first output byte and to exit,
with its peak resident memory (getrusage of the child), for
  text         dphil-show FILE              (the first episode)
  svg          dphil-show -f svg FILE       (the first episode)
  html-page    dphil-show FILE -o page.html (the first 1,000 episodes: the default --limit)
  last         dphil-show -e LAST_ID FILE   (every record read, one shown)
  all | head   dphil-show --all FILE | head -40
and `python -c pass` / `dphil-show --help` as the start-up floor. Each figure
is the best of --repeats runs (the machine is shared; the minimum is the
least disturbed).
Issue 14: the first page of a 100,000-episode file in under a second; memory
bounded by the episodes shown, not by the file.
Run: taskset -c 0 python bench/bench_show.py [--episodes N] [--repeats K]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import orjson

from dphil.core.episode import play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.console_scripts import locate
from dphil.io.jsonl import dumps
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import Scorer

POLICIES = ("hierarchy", "random", "naive", "greedy", "thinker", "idle")


def make_file(path: str, episodes: int) -> str:
    """Write the episodes, scored; return the last one's id."""
    scorer = Scorer(RewardSpec())
    last = ""
    with open(path, "wb") as fh:
        for k in range(episodes):
            name = POLICIES[k % len(POLICIES)]
            record = play(EpisodeConfig(model=f"scripted:{name}", n=5, rounds=5, seed=k), get_policy(name))
            line = dumps(record)
            fh.write(scorer.line(orjson.loads(line), line))
            last = record["episode_id"]
    return last


_CHILD = r"""
import os, resource, subprocess, sys, time
start = time.perf_counter()
p = subprocess.Popen(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, shell=sys.argv[1] == "shell")
first = None
size = 0
while True:
    chunk = p.stdout.read1(1 << 16)
    if not chunk:
        break
    if first is None:
        first = time.perf_counter() - start
    size += len(chunk)
p.wait()
total = time.perf_counter() - start
print(first if first is not None else total, total, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, size,
      p.returncode)
"""


def measure(args: list[str], *, shell: bool = False) -> tuple[float, float, int, int]:
    """(seconds to the first output byte, seconds to exit, peak RSS in KiB, output bytes) of one run."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, "shell" if shell else "exec", *args], capture_output=True, check=True, text=True
    )
    first, total, rss, size, rc = out.stdout.split()
    assert int(rc) == 0, (args, rc)
    return float(first), float(total), int(rss), int(size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    show = locate("dphil-show") or sys.exit("dphil-show is not installed: pip install -e .")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "episodes.jsonl")
        t0 = time.perf_counter()
        last = make_file(src, args.episodes)
        print(
            f"{args.episodes:,} episodes, {os.path.getsize(src) / 2**20:.0f} MiB, "
            f"made in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        page = os.path.join(tmp, "page.html")
        cases = {
            "python -c pass": ([sys.executable, "-c", "pass"], False),
            "dphil-show --help": ([show, "--help"], False),
            "text (first episode)": ([show, src], False),
            "svg (first episode)": ([show, "-f", "svg", src], False),
            "html, 1,000 episodes": ([show, src, "-o", page], False),
            "-e LAST_ID (reads all)": ([show, "-e", last, src], False),
            "--all | head -40": ([f"{show} --all {src} | head -40"], True),
        }
        print(f"{'case':26} {'first byte s':>12} {'exit s':>8} {'peak RSS MiB':>13} {'output':>10}")
        for name, (cmd, shell) in cases.items():
            runs = [measure(cmd, shell=shell) for _ in range(args.repeats)]
            first = min(r[0] for r in runs)
            total = min(r[1] for r in runs)
            rss = min(r[2] for r in runs) / 1024
            size = runs[0][3] or (os.path.getsize(page) if "html" in name else 0)
            print(f"{name:26} {first:12.3f} {total:8.3f} {rss:13.1f} {size / 1024:8.0f} KB", flush=True)


if __name__ == "__main__":
    main()
