"""Throughput of one model spread over three servers (litellm's Router) against one server.

Each test server (its own process) answers after --latency seconds and handles at most
--capacity requests at once, like a GPU server with a fixed batch: one such server serves
at most capacity / latency calls/s, whatever the client does. The client is dphil's
Gateway with --concurrency calls in flight, as `dphil-rollout --concurrency` runs it:
  one     a registry entry with one api_base (the plain path, no Router)
  three   the same entry with three api_base URLs (litellm's Router, simple-shuffle)
Ideal: three times one. Figures are medians of --repeat interleaved runs.

    python bench/bench_servers_router.py [--calls 1200] [--latency 0.1] [--capacity 4]
                                         [--concurrency 24] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_llm import KEY, SERVER_MODEL, messages  # noqa: E402
from dphil.agents.limits import Limits  # noqa: E402
from dphil.agents.llm import Gateway  # noqa: E402
from dphil.agents.registry import ModelSpec  # noqa: E402
from dphil.agents.tools import tool_specs  # noqa: E402


def start_server(latency: float, capacity: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests" / "support" / "openai_server.py"),
            "--latency",
            str(latency),
            "--capacity",
            str(capacity),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit("the test server did not start")
    return proc, url


async def throughput(bases: list[str], calls: int, concurrency: int) -> float:
    os.environ["DPHIL_BENCH_KEY"] = KEY
    spec = ModelSpec(
        name="bench", model=SERVER_MODEL, api_base=bases[0] if len(bases) == 1 else bases, api_key_env="DPHIL_BENCH_KEY"
    )
    gw = Gateway(Limits(concurrency=concurrency, timeout=60, retries=0))
    msgs, tools = messages(), tool_specs("paper")
    answered: dict[str | None, int] = {}

    async def batch(count: int) -> None:
        queue = iter(range(count))

        async def worker() -> None:
            for _ in queue:
                c = await gw.complete(spec, msgs, tools=tools)
                answered[c.server] = answered.get(c.server, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    await batch(concurrency * 2)  # warm-up: connections, imports, the Router
    answered.clear()
    start = time.perf_counter()
    await batch(calls)
    rate = calls / (time.perf_counter() - start)
    if len(bases) > 1:
        assert set(answered) == set(bases), answered  # every server took its share
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1200)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    servers = [start_server(args.latency, args.capacity) for _ in range(3)]
    urls = [url for _, url in servers]
    runs: dict[str, list[float]] = {"one": [], "three": []}
    try:
        for _ in range(args.repeat):
            runs["one"].append(asyncio.run(throughput(urls[:1], args.calls, args.concurrency)))
            runs["three"].append(asyncio.run(throughput(urls, args.calls, args.concurrency)))
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait()
    ideal = args.capacity / args.latency
    one, three = (statistics.median(runs[k]) for k in ("one", "three"))
    print(
        f"server latency {args.latency * 1000:.0f} ms, capacity {args.capacity} at once "
        f"(at most {ideal:.0f} calls/s each), concurrency {args.concurrency}, {args.calls} calls, "
        f"medians of {args.repeat} interleaved runs"
    )
    print(
        f"one server     {one:7.1f} calls/s  ({one / ideal:5.1%} of its capacity)  "
        f"[runs: {' '.join(f'{r:.0f}' for r in runs['one'])}]"
    )
    print(
        f"three servers  {three:7.1f} calls/s  ({three / one:4.2f}x one; ideal 3x)  "
        f"[runs: {' '.join(f'{r:.0f}' for r in runs['three'])}]"
    )


if __name__ == "__main__":
    main()
