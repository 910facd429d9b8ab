"""dphil-score throughput against the floor of any Python JSONL filter.

Generates 100,000 scripted episodes (a mix of policies, so deadlocks, conflicts
and full episodes all occur), then times
  (a) a bare orjson loads + dumps pass over the file, and
  (b) the dphil-score pipeline (read, validate, replay, score, write),
both in-process on one core, reading and writing real files, and
  (c) the installed command at the end of a real pipe.
Target (issue 2): (b) at least half the throughput of (a).
Run: taskset -c 0 python bench/bench_score.py [--episodes N] [--repeats K]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import orjson

from dphil.core.episode import clear_memo, play
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig
from dphil.io.jsonl import RecordReader, RecordWriter, dumps
from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import Scorer

POLICIES = ("hierarchy", "random", "naive", "greedy", "thinker")


def make_file(path: str, episodes: int) -> None:
    with open(path, "wb") as fh:
        for k in range(episodes):
            name = POLICIES[k % len(POLICIES)]
            config = EpisodeConfig(model=f"scripted:{name}", n=5, rounds=5, seed=k)
            fh.write(dumps(play(config, get_policy(name))))


def bare(src: str, dst: str) -> float:
    start = time.perf_counter()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        loads, dump = orjson.loads, orjson.dumps
        for line in fin:
            fout.write(dump(loads(line)) + b"\n")
    return time.perf_counter() - start


def dphil_score(src: str, dst: str) -> float:
    clear_memo()  # every timed run starts cold, as a fresh dphil-score process does
    scorer = Scorer(RewardSpec(variant="shaped"))
    start = time.perf_counter()
    reader = RecordReader([src])
    with RecordWriter(dst) as writer:
        for record in reader:
            writer.write_line(scorer.line(record, reader.raw))
    return time.perf_counter() - start


def cli(src: str) -> float:
    """`cat FILE | dphil-score --shaped > /dev/null`, timed from start-up to exit."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as fout:
        cat = subprocess.Popen(["cat", src], stdout=subprocess.PIPE)
        score = subprocess.run(
            [sys.executable, "-m", "dphil.commands.score", "--shaped"], stdin=cat.stdout, stdout=fout, check=True
        )
        cat.stdout.close()  # type: ignore[union-attr]
        cat.wait()
    assert score.returncode == 0
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "episodes.jsonl")
        make_file(src, args.episodes)
        size = os.path.getsize(src) / 1e6
        # Alternate the measurements and keep each one's best, so a slow spell of a shared
        # machine does not land on one side only. The command also runs as a process
        # reading a real pipe, start-up included.
        t_bare = t_score = t_cli = float("inf")
        for _ in range(args.repeats):
            t_bare = min(t_bare, bare(src, os.path.join(tmp, "bare.jsonl")))
            t_score = min(t_score, dphil_score(src, os.path.join(tmp, "scored.jsonl")))
            t_cli = min(t_cli, cli(src))
    n = args.episodes
    print(f"file: {n:,} episodes, {size:.1f} MB")
    print(f"bare orjson loads+dumps : {n / t_bare:10,.0f} records/s")
    print(f"dphil-score (in-process): {n / t_score:10,.0f} records/s   ratio {t_bare / t_score:.2f}")
    print(f"dphil-score (CLI, pipe) : {n / t_cli:10,.0f} records/s   ratio {t_bare / t_cli:.2f}")


if __name__ == "__main__":
    main()
