"""How close dphil's LLM path comes to the network's limit.

Against the test OpenAI-compatible server (its own process) answering after
100 ms, with 64 calls in flight, it measures calls/s of:
  ideal     64 / 0.1 s = 640 calls/s
  bare      a bare openai.AsyncOpenAI loop: 64 workers, nothing else
  gateway   dphil's Gateway.complete (litellm, retries, accounting, semaphore)
  episodes  whole episodes (N=5, simultaneous, tools) through run_models
The target is gateway and episodes >= 80% of bare.

    python bench/bench_llm.py [--calls 3000] [--latency 0.1] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dphil.agents.agent import AgentSettings  # noqa: E402
from dphil.agents.llm import Gateway, Limits  # noqa: E402
from dphil.agents.prompts import builtin_prompt, observation_text  # noqa: E402
from dphil.agents.registry import ModelSpec  # noqa: E402
from dphil.agents.runner import model_variant, run_models_async  # noqa: E402
from dphil.agents.tools import tool_specs  # noqa: E402
from dphil.records import EpisodeConfig  # noqa: E402
from dphil.table import Table  # noqa: E402

KEY = "sk-bench-not-a-secret"


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "openai_server.py"), "--latency", str(latency)],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit("the test server did not start")
    return proc, url


def messages() -> list[dict]:
    prompt = builtin_prompt()
    return [{"role": "system", "content": prompt.system("paper", 5, 0)},
            {"role": "user", "content": observation_text(Table(5, 5).observe(0))}]


async def pool(calls: int, concurrency: int, one) -> float:
    queue = iter(range(calls))

    async def worker() -> None:
        for _ in queue:
            await one()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return calls / (time.perf_counter() - start)


async def bare(url: str, calls: int, concurrency: int) -> float:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=60)
    msgs, tools = messages(), tool_specs("paper")

    async def one() -> None:
        r = await client.chat.completions.create(model="bench", messages=msgs, tools=tools)
        assert r.choices[0].message.tool_calls

    await pool(concurrency, concurrency, one)  # warm-up: connections, imports
    rate = await pool(calls, concurrency, one)
    await client.close()
    return rate


async def gateway(url: str, calls: int, concurrency: int) -> float:
    os.environ["DPHIL_BENCH_KEY"] = KEY
    spec = ModelSpec(name="bench", model="openai/bench", api_base=url, api_key_env="DPHIL_BENCH_KEY")
    gw = Gateway(Limits(concurrency=concurrency, timeout=60))
    msgs, tools = messages(), tool_specs("paper")

    async def one() -> None:
        c = await gw.complete(spec, msgs, tools=tools)
        assert c.tool_calls

    await pool(concurrency, concurrency, one)
    # More workers than slots: the gateway's semaphore is what bounds the calls in flight.
    return await pool(calls, concurrency * 2, one)


async def episodes(url: str, calls: int, concurrency: int, memory: str = "none") -> float:
    os.environ["DPHIL_BENCH_KEY"] = KEY
    spec = ModelSpec(name="bench", model="openai/bench", api_base=url, api_key_env="DPHIL_BENCH_KEY")
    settings = AgentSettings(builtin_prompt(), memory=memory)
    variant = model_variant(spec, settings)
    n, rounds = 5, 5
    count = max(1, calls // (n * rounds))
    configs = [EpisodeConfig("bench", n, rounds=rounds, seed=k, variant=variant)
               for k in range(count)]
    gw = Gateway(Limits(concurrency=concurrency, timeout=60))
    records: list[dict] = []
    start = time.perf_counter()
    await run_models_async(configs, {"bench": spec}, settings, records.append, gateway=gw)
    elapsed = time.perf_counter() - start
    assert all(r["status"] == "complete" for r in records)
    return gw.stats.calls / elapsed


def timed(fn, url: str, args: argparse.Namespace) -> tuple[float, float]:
    """Calls/s of one figure, and this process's CPU milliseconds per call (warm-up included)."""
    cpu = time.process_time()
    rate = asyncio.run(fn(url, args.calls, args.concurrency))
    used = time.process_time() - cpu
    return rate, 1000 * used / (args.calls + args.concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    proc, url = start_server(args.latency)
    try:
        ideal = args.concurrency / args.latency
        b, b_cpu = timed(bare, url, args)
        g, g_cpu = timed(gateway, url, args)
        e, e_cpu = timed(episodes, url, args)
        f, f_cpu = timed(lambda u, c, k: episodes(u, c, k, "full"), url, args)
    finally:
        proc.terminate()
        proc.wait()
    print(f"server latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency}, "
          f"{args.calls} calls per figure")
    print(f"ideal     {ideal:8.1f} calls/s")
    print(f"bare      {b:8.1f} calls/s  ({b / ideal:6.1%} of ideal)  {b_cpu:5.2f} ms CPU/call  "
          "openai.AsyncOpenAI loop")
    print(f"gateway   {g:8.1f} calls/s  ({g / b:6.1%} of bare)   {g_cpu:5.2f} ms CPU/call  "
          "dphil Gateway via litellm, same request")
    print(f"episodes  {e:8.1f} calls/s  ({e / b:6.1%} of bare)   {e_cpu:5.2f} ms CPU/call  "
          "run_models, N=5, R=5, --memory none")
    print(f"episodes  {f:8.1f} calls/s  ({f / b:6.1%} of bare)   {f_cpu:5.2f} ms CPU/call  "
          "run_models, N=5, R=5, --memory full (prompts grow each round)")


if __name__ == "__main__":
    main()
