"""Engine throughput: scripted episodes per second, JSONL writing included, on one core.

Each episode is played and serialised as dphil-rollout does (`dphil.core.episode.play_line`).

Target (issue 2): at least 20,000 episodes/s at N=5, R=5, and time per episode
linear in N*R up to N=1,000. Each figure is the best of three repeats, so that
other work on a shared machine does not decide it; pin a core for stable
numbers: taskset -c 0 python bench/bench_engine.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import time

from dphil.core.episode import play_line
from dphil.core.policies import get_policy
from dphil.core.records import EpisodeConfig


def rate(policy_name: str, n: int, rounds: int, episodes: int, schedule: str = "simultaneous") -> float:
    return max(once(policy_name, n, rounds, episodes, schedule) for _ in range(3))


def once(policy_name: str, n: int, rounds: int, episodes: int, schedule: str) -> float:
    policy = get_policy(policy_name)
    fd = os.open(os.devnull, os.O_WRONLY)
    chunks: list[bytes] = []
    cell = EpisodeConfig(model=f"scripted:{policy_name}", n=n, rounds=rounds, schedule=schedule)
    start = time.perf_counter()
    for seed in range(episodes):
        chunks.append(play_line(cell.with_seed(seed), policy))
        if len(chunks) >= 256:
            os.write(fd, b"".join(chunks))
            chunks.clear()
    os.write(fd, b"".join(chunks))
    elapsed = time.perf_counter() - start
    os.close(fd)
    return episodes / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    episodes = 5_000 if args.quick else 50_000
    print("policy     schedule      N    R   episodes/s   us/(N*R)")
    for policy in ("hierarchy", "random", "naive", "thinker"):
        for schedule in ("simultaneous", "sequential"):
            r = rate(policy, 5, 5, episodes, schedule)
            print(f"{policy:10} {schedule:12} {5:4} {5:4} {r:12,.0f} {1e6 / r / 25:10.2f}")
    for n in (5, 50, 200, 1000):
        eps = max(20, episodes * 5 // n // 10)
        r = rate("hierarchy", n, 5, eps)
        print(f"{'hierarchy':10} {'simultaneous':12} {n:4} {5:4} {r:12,.1f} {1e6 / r / (n * 5):10.2f}")


if __name__ == "__main__":
    main()
