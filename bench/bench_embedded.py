"""An embedded model (`-m qwen2.5-0.5b`): dphil against a bare loop, and its prompt cache.

Two phases in one run, on the same GGUF, llama.cpp settings and threads:

  dphil   `dphil-rollout -m ALIAS -n N --episodes E --rounds R --memory full`, which starts its
          own llama.cpp server (one slot per philosopher) and stops it; calls, prompt and
          cached tokens come from the records, by round
  bare    a server started here with the same arguments (`llamacpp_server`, N slots), and a
          bare openai.AsyncOpenAI loop playing the same shape of work: N conversations at
          once, each the real system prompt and round-1 observation, then per round the
          model's reply and the observation again (the same size as dphil's), each
          philosopher's calls naming its own slot with cache_prompt, rounds in lockstep as
          at dphil's simultaneous table

dphil's throughput is taken over the rollout's wall time less the server's start-up, which
is measured on the bare phase's server (loading the GGUF and answering /v1/models); the
whole command's wall time is reported beside it. Writes OUT/summary.json and OUT/summary.md.

    nice python bench/bench_embedded.py [--model qwen2.5-0.5b-text] [--sizes 5,10,15]
        [--episodes 2] [--rounds 5] [--out bench/results/embedded]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dphil.agents.prompts import builtin_prompt, observation_text  # noqa: E402
from dphil.agents.registry import Registry  # noqa: E402
from dphil.agents.tools import tool_specs  # noqa: E402
from dphil.core.table import Table  # noqa: E402
from dphil.io.console_scripts import locate  # noqa: E402
from dphil.serving import catalogue, weights  # noqa: E402
from dphil.serving.embedded import served_name  # noqa: E402
from dphil.serving.processes import llamacpp_server  # noqa: E402


def by_round(turns: list[dict], rounds: int) -> list[dict]:
    """Prompt and cached tokens per round over `turns`."""
    out = []
    for r in range(1, rounds + 1):
        these = [t for t in turns if t["round"] == r]
        prompt = sum(t["usage"].get("prompt_tokens", 0) for t in these)
        cached = sum(t["usage"].get("cached_tokens", 0) for t in these)
        out.append({"round": r, "calls": len(these), "prompt_tokens": prompt, "cached_tokens": cached})
    return out


def hit_rate_from_round_2(rows: list[dict]) -> float | None:
    prompt = sum(r["prompt_tokens"] for r in rows if r["round"] >= 2)
    cached = sum(r["cached_tokens"] for r in rows if r["round"] >= 2)
    return round(cached / prompt, 3) if prompt else None


def dphil_phase(alias: str, n: int, args: argparse.Namespace, startup_s: float) -> dict:
    exe = locate("dphil-rollout") or sys.exit("bench_embedded: dphil-rollout is not installed")
    cmd = [exe, "-m", alias, "-n", str(n), "--episodes", str(args.episodes), "--rounds", str(args.rounds)]
    cmd += ["--memory", "full", "--concurrency", str(n), "--timeout", "900", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPHIL_QWEN25") and k != "DPHIL_GEMMA_270M_URL"}
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, env=env)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"bench_embedded: dphil-rollout exit {p.returncode}: {p.stderr.decode()[-600:]}")
    episodes = [json.loads(x) for x in p.stdout.decode().splitlines()]
    turns = [t for ep in episodes for t in ep["turns"]]
    rows = by_round(turns, args.rounds)
    busy = max(wall - startup_s, 1e-9)
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {
        "n": n,
        "episodes": len(episodes),
        "calls": len(turns),
        "wall_s": round(wall, 1),
        "s_per_episode": round(wall / len(episodes), 1),
        "calls_per_s": round(len(turns) / busy, 3),
        "prompt_tokens_per_s": round(prompt / busy, 1),
        "cache_hit_from_round_2": hit_rate_from_round_2(rows),
        "by_round": rows,
    }


async def bare_phase(url: str, model: str, spec, n: int, args: argparse.Namespace) -> dict:
    """N growing conversations, one slot each, rounds in lockstep, E times over."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)
    prompt = builtin_prompt("default")
    table = Table(n, 1)
    extra: dict = {"extra_body": {"cache_prompt": True}}
    if spec.tools:
        extra["tools"] = tool_specs("paper")
        if spec.tool_choice:
            extra["tool_choice"] = spec.tool_choice
    rows = [{"round": r, "calls": 0, "prompt_tokens": 0, "cached_tokens": 0} for r in range(1, args.rounds + 1)]

    async def call(slot: int, messages: list[dict], r: int) -> str:
        body = {**extra["extra_body"], "id_slot": slot}
        kw = {k: v for k, v in extra.items() if k != "extra_body"}
        resp = await client.chat.completions.create(
            model=model, messages=messages, extra_body=body, **dict(spec.params), **kw
        )
        u = resp.usage
        details = getattr(u, "prompt_tokens_details", None)
        rows[r - 1]["calls"] += 1
        rows[r - 1]["prompt_tokens"] += u.prompt_tokens
        rows[r - 1]["cached_tokens"] += (getattr(details, "cached_tokens", 0) or 0) if details else 0
        return resp.choices[0].message.content or ""

    start = time.perf_counter()
    for _ in range(args.episodes):
        obs = [observation_text(table.observe(i), {"messages": [], "talk": None}, tools=spec.tools) for i in range(n)]
        convs = [
            [
                {"role": "system", "content": prompt.system("paper", n, i, tools=spec.tools)},
                {"role": "user", "content": obs[i]},
            ]
            for i in range(n)
        ]
        for r in range(1, args.rounds + 1):
            replies = await asyncio.gather(*(call(i, convs[i], r) for i in range(n)))
            for i, reply in enumerate(replies):
                convs[i] += [{"role": "assistant", "content": reply}, {"role": "user", "content": obs[i]}]
    wall = time.perf_counter() - start
    await client.close()
    calls = sum(r["calls"] for r in rows)
    return {
        "n": n,
        "calls": calls,
        "wall_s": round(wall, 1),
        "calls_per_s": round(calls / wall, 3),
        "prompt_tokens_per_s": round(sum(r["prompt_tokens"] for r in rows) / wall, 1),
        "cache_hit_from_round_2": hit_rate_from_round_2(rows),
        "by_round": rows,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-0.5b-text")
    p.add_argument("--sizes", default="5")
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embedded")
    args = p.parse_args()
    spec = Registry.load().resolve(args.model)
    entry = catalogue.find(spec.local)
    gguf = catalogue.assemble(entry, os.path.join(weights.cache_dir(), entry.file))
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        server = llamacpp_server(
            gguf,
            parallel=n,
            threads=args.threads,
            ctx_size=int(entry.server.get("ctx_size", 4096)),
            alias=served_name(spec),
        )
        t0 = time.perf_counter()
        with server:
            startup = time.perf_counter() - t0
            bare = asyncio.run(bare_phase(server.url, server.model, spec, n, args))
        dphil = dphil_phase(args.model, n, args, startup)
        ratio = {k: round(dphil[k] / bare[k], 3) if bare[k] else None for k in ("calls_per_s", "prompt_tokens_per_s")}
        row = {"model": args.model, "n": n, "server_startup_s": round(startup, 1), "dphil": dphil, "bare": bare}
        results.append({**row, "ratio": ratio})
        print(json.dumps({"n": n, "ratio": ratio, "hit": dphil["cache_hit_from_round_2"]}), file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| model | N | dphil calls/s | bare calls/s | ratio | dphil prompt tok/s | bare | ratio "
        "| cache hit from round 2 (dphil / bare) | s per episode (whole command) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in results:
        d, b, q = r["dphil"], r["bare"], r["ratio"]
        lines.append(
            f"| {r['model']} | {r['n']} | {d['calls_per_s']} | {b['calls_per_s']} | {q['calls_per_s']} "
            f"| {d['prompt_tokens_per_s']} | {b['prompt_tokens_per_s']} | {q['prompt_tokens_per_s']} "
            f"| {d['cache_hit_from_round_2']} / {b['cache_hit_from_round_2']} | {d['s_per_episode']} |"
        )
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"bench_embedded: wrote {args.out / 'summary.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
