"""How close dphil's LLM path comes to the network's limit.

Against the test OpenAI-compatible server (its own process) answering after
100 ms, with 64 calls in flight, it measures calls/s of:
  ideal     64 / 0.1 s = 640 calls/s
  bare      a bare openai.AsyncOpenAI loop: 64 workers, nothing else
  gateway   dphil's Gateway.complete (litellm, retries, accounting, semaphore), same request
  episodes  whole episodes (N=5, simultaneous, tools) through run_models
The target is gateway and episodes >= 80% of bare.

The gateway and episodes reach the server as `hosted_vllm/bench`: that is how the
default registry reaches OpenAI-compatible servers (vLLM, Ollama), and litellm
serves it with its own HTTP handler. `gateway openai/` shows litellm's OpenAI
provider for comparison: it goes through the openai SDK (the same request
validation the bare loop pays) and then converts the SDK's reply, so it costs
more CPU per call; that is what hosted APIs such as `openai/gpt-5.4` take.

Every figure is measured --repeat times, interleaved (one round runs each figure
once, in turn), and the medians are reported: the machine is shared, so single
runs drift with whatever else is running. CPU ms/call is this process's CPU time
per call in the timed part (warm-up excluded), the figure least disturbed by
neighbours; when the client is CPU-bound, calls/s follow it.

    python bench/bench_llm.py [--calls 3000] [--latency 0.1] [--concurrency 64] [--repeat 3]
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

from dphil.agents.agent import AgentSettings  # noqa: E402
from dphil.agents.limits import Limits  # noqa: E402
from dphil.agents.llm import Gateway  # noqa: E402
from dphil.agents.prompts import builtin_prompt, observation_text  # noqa: E402
from dphil.agents.registry import ModelSpec  # noqa: E402
from dphil.agents.runner import model_variant, run_models_async  # noqa: E402
from dphil.agents.tools import tool_specs  # noqa: E402
from dphil.core.records import EpisodeConfig  # noqa: E402
from dphil.core.table import Table  # noqa: E402

KEY = "sk-bench-not-a-secret"
# How the default registry reaches an OpenAI-compatible server, and litellm's OpenAI provider.
SERVER_MODEL = "hosted_vllm/bench"
OPENAI_MODEL = "openai/bench"


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "openai_server.py"), "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit("the test server did not start")
    return proc, url


def messages() -> list[dict]:
    prompt = builtin_prompt()
    return [
        {"role": "system", "content": prompt.system("paper", 5, 0)},
        {"role": "user", "content": observation_text(Table(5, 5).observe(0))},
    ]


async def pool(calls: int, concurrency: int, one) -> tuple[float, float]:
    """Calls/s of `calls` calls by `concurrency` workers, and CPU ms per call meanwhile."""
    queue = iter(range(calls))

    async def worker() -> None:
        for _ in queue:
            await one()

    cpu = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rate = calls / (time.perf_counter() - start)
    return rate, 1000 * (time.process_time() - cpu) / calls


def bench_spec(url: str, model: str) -> ModelSpec:
    os.environ["DPHIL_BENCH_KEY"] = KEY
    return ModelSpec(name="bench", model=model, api_base=url, api_key_env="DPHIL_BENCH_KEY")


async def bare(url: str, calls: int, concurrency: int) -> tuple[float, float]:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=60)
    msgs, tools = messages(), tool_specs("paper")

    async def one() -> None:
        r = await client.chat.completions.create(model="bench", messages=msgs, tools=tools)
        assert r.choices[0].message.tool_calls

    await pool(concurrency * 2, concurrency, one)  # warm-up: connections, imports
    result = await pool(calls, concurrency, one)
    await client.close()
    return result


async def gateway(url: str, calls: int, concurrency: int, model: str = SERVER_MODEL) -> tuple[float, float]:
    spec = bench_spec(url, model)
    gw = Gateway(Limits(concurrency=concurrency, timeout=60))
    msgs, tools = messages(), tool_specs("paper")

    async def one() -> None:
        c = await gw.complete(spec, msgs, tools=tools)
        assert c.tool_calls

    await pool(concurrency * 2, concurrency, one)
    # More workers than slots: the gateway's semaphore is what bounds the calls in flight.
    return await pool(calls, concurrency * 2, one)


async def episodes(url: str, calls: int, concurrency: int, memory: str = "none") -> tuple[float, float]:
    spec = bench_spec(url, SERVER_MODEL)
    settings = AgentSettings(builtin_prompt(), memory=memory)
    variant = model_variant(spec, settings)
    n, rounds = 5, 5
    gw = Gateway(Limits(concurrency=concurrency, timeout=60))

    async def run(count: int, first: int) -> tuple[float, float]:
        configs = [EpisodeConfig("bench", n, rounds=rounds, seed=first + k, variant=variant) for k in range(count)]
        records: list[dict] = []
        calls_before = gw.stats.calls
        cpu = time.process_time()
        start = time.perf_counter()
        await run_models_async(configs, {"bench": spec}, settings, records.append, gateway=gw)
        elapsed = time.perf_counter() - start
        assert all(r["status"] == "complete" for r in records)
        made = gw.stats.calls - calls_before
        return made / elapsed, 1000 * (time.process_time() - cpu) / made

    await run(max(1, concurrency * 2 // (n * rounds)), 10**6)  # warm-up
    return await run(max(1, calls // (n * rounds)), 0)


FIGURES = {
    "bare": (bare, "openai.AsyncOpenAI loop"),
    "gateway": (gateway, f"dphil Gateway via litellm, {SERVER_MODEL}, same request"),
    "gateway openai/": (
        lambda u, c, k: gateway(u, c, k, OPENAI_MODEL),
        f"the same through litellm's OpenAI provider, {OPENAI_MODEL}",
    ),
    "episodes": (episodes, "run_models, N=5, R=5, --memory none"),
    "episodes full": (
        lambda u, c, k: episodes(u, c, k, "full"),
        "run_models, N=5, R=5, --memory full (prompts grow each round)",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are reported")
    args = parser.parse_args()
    proc, url = start_server(args.latency)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in FIGURES}
    try:
        for _ in range(args.repeat):
            for name, (fn, _) in FIGURES.items():
                runs[name].append(asyncio.run(fn(url, args.calls, args.concurrency)))
    finally:
        proc.terminate()
        proc.wait()
    ideal = args.concurrency / args.latency
    rate = {name: statistics.median(r for r, _ in got) for name, got in runs.items()}
    cpu = {name: statistics.median(c for _, c in got) for name, got in runs.items()}
    print(
        f"server latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency}, "
        f"{args.calls} calls per figure, medians of {args.repeat} interleaved runs"
    )
    print(f"{'ideal':16s}{ideal:8.1f} calls/s")
    for name, (_, what) in FIGURES.items():
        share = (
            f"({rate[name] / ideal:6.1%} of ideal)"
            if name == "bare"
            else f"({rate[name] / rate['bare']:6.1%} of bare) "
        )
        each = " ".join(f"{r:.0f}" for r, _ in runs[name])
        print(f"{name:16s}{rate[name]:8.1f} calls/s  {share}  {cpu[name]:5.2f} ms CPU/call  {what}  [runs: {each}]")


if __name__ == "__main__":
    main()
