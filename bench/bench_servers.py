"""A real model behind real local servers: how dphil-rollout plays, and what it costs.

For each server (llama.cpp through `python -m dphil.serving.llamacpp`, and `transformers
serve`), started here on a free loopback port with Gemma 3 270M base (`dphil-weights`):

  bare      the server's own speed: a bare openai.AsyncOpenAI loop sending the round-1
            prompts of the grid (system + first observation, the registry entry's
            parameters), at dphil's concurrency; for llama.cpp also at concurrency 1,
            which shows what its parallel slots buy
  dphil     `dphil-rollout` with tools (llama.cpp: tool_choice "required") and without
            (the `ACTION:` text fallback), N=3 and N=5: parse rate (turns with a legal
            action, turns null), calls/s, completion tokens/s, wall seconds per episode

dphil's overhead is the ratio of its calls/s to the bare loop's (its later rounds carry
longer prompts than round 1, so the ratio slightly flatters the bare loop). Then every
model episode and the scripted baselines (random, naive, hierarchy, idle) on the same
seeds are scored under both rewards and summarised by `dphil-stats --format markdown`.

    nice python bench/bench_servers.py [--servers llamacpp,transformers] [--episodes 3]
        [--rounds 3] [--sizes 3,5] [--prompt default] [--parallel 3] [--threads 2]
        [--out bench/results/servers]

Writes OUT/summary.json, OUT/summary.md and the episodes (OUT/episodes.scored.*.jsonl).
The machine is shared and 2-core: numbers are this run's, not a law.
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
from dphil.core.protocols import PROTOCOLS  # noqa: E402
from dphil.core.table import Table  # noqa: E402
from dphil.io.console_scripts import locate  # noqa: E402
from dphil.serving.processes import SERVERS, LocalServer  # noqa: E402

ACTIONS = set(PROTOCOLS["paper"])
BASELINES = ("scripted:random", "scripted:naive", "scripted:hierarchy", "scripted:idle")
LLAMACPP_ALIASES = {"tools": "gemma-3-270m-llamacpp", "text": "gemma-3-270m-llamacpp-text"}


def dphil(*args: str, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = locate(args[0]) or sys.exit(f"bench_servers: {args[0]} is not installed (pip install -e '.[real]')")
    p = subprocess.run([exe, *args[1:]], input=stdin, capture_output=True, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])}...: exit {p.returncode}: {p.stderr.decode()[-800:]}")
    return p


def round_one_messages(n: int, tools: bool, prompt_name: str) -> list[list[dict]]:
    """Every seat's first request of an episode: the system prompt and the first observation."""
    prompt = builtin_prompt(prompt_name)
    table = Table(n, 1)
    return [
        [
            {"role": "system", "content": prompt.system("paper", n, i, tools=tools)},
            {
                "role": "user",
                "content": observation_text(table.observe(i), {"messages": [], "talk": None}, tools=tools),
            },
        ]
        for i in range(n)
    ]


async def bare_loop(
    url: str,
    model: str,
    requests: list[list[dict]],
    params: dict,
    tools: bool,
    tool_choice: str | None,
    concurrency: int,
) -> dict:
    """The same requests straight to the server, `concurrency` at a time: its own speed."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)
    extra = {"tools": tool_specs("paper"), **({"tool_choice": tool_choice} if tool_choice else {})} if tools else {}
    queue = list(requests)
    completion_tokens = prompt_tokens = 0

    async def worker() -> None:
        nonlocal completion_tokens, prompt_tokens
        while queue:
            messages = queue.pop()
            r = await client.chat.completions.create(model=model, messages=messages, **params, **extra)
            completion_tokens += r.usage.completion_tokens
            prompt_tokens += r.usage.prompt_tokens

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    return {
        "calls": len(requests),
        "concurrency": concurrency,
        "wall_s": round(wall, 2),
        "calls_per_s": round(len(requests) / wall, 3),
        "completion_tokens_per_s": round(completion_tokens / wall, 2),
        "prompt_tokens_per_s": round(prompt_tokens / wall, 1),
    }


def parse_rates(episodes: list[dict]) -> dict:
    turns = [t for ep in episodes for t in ep["turns"]]
    legal = sum(1 for t in turns if t["action"] in ACTIONS)
    null = sum(1 for t in turns if t["action"] is None)
    return {
        "turns": len(turns),
        "legal_share": round(legal / len(turns), 3) if turns else None,
        "null_share": round(null / len(turns), 3) if turns else None,
    }


def play(alias: str, n: int, args: argparse.Namespace, env: dict, out: Path) -> dict:
    """One cell through the real command; its episodes are appended to `out`."""
    start = time.perf_counter()
    p = dphil(
        "dphil-rollout",
        "-m",
        alias,
        "-n",
        str(n),
        "--episodes",
        str(args.episodes),
        "--rounds",
        str(args.rounds),
        "--prompt",
        args.prompt,
        "--concurrency",
        str(args.parallel),
        "--timeout",
        "900",
        "-q",
        env=env,
    )
    wall = time.perf_counter() - start
    episodes = [json.loads(x) for x in p.stdout.decode().splitlines()]
    bad = [ep.get("error") for ep in episodes if ep["status"] != "complete"]
    if bad:
        raise SystemExit(f"{alias} n={n}: {len(bad)} episode(s) errored: {bad[0]}")
    with open(out, "ab") as fh:
        fh.write(p.stdout)
    calls = sum(ep["usage"]["calls"] for ep in episodes)
    completion = sum(ep["usage"]["completion_tokens"] for ep in episodes)
    latencies = sorted(t["latency_s"] for ep in episodes for t in ep["turns"])
    return {
        "model": alias,
        "n": n,
        "episodes": len(episodes),
        "calls": calls,
        "wall_s": round(wall, 1),
        "calls_per_s": round(calls / wall, 3),
        "completion_tokens_per_s": round(completion / wall, 2),
        "s_per_episode": round(wall / len(episodes), 1),
        "median_latency_s": latencies[len(latencies) // 2] if latencies else None,
        **parse_rates(episodes),
    }


def bench_server(
    kind: str,
    server: LocalServer,
    aliases: dict[str, str],
    registry: Registry,
    args: argparse.Namespace,
    env: dict,
    out: Path,
) -> dict:
    result: dict = {
        "server": kind,
        "url": server.url,
        "parallel": args.parallel,
        "threads": args.threads,
        "bare": [],
        "dphil": [],
    }
    for mode, alias in aliases.items():
        spec = registry.resolve(alias)
        params = dict(spec.params)
        requests = [m for n in args.sizes for m in round_one_messages(n, spec.tools, args.prompt)]
        # llama.cpp's slots: the N=3 requests once more, one at a time.
        levels = [(args.parallel, requests)]
        if kind == "llama.cpp" and args.parallel > 1 and mode == "text":
            levels.append((1, requests[: args.sizes[0]]))
        for c, batch in levels:
            r = asyncio.run(bare_loop(server.url, server.model, batch, params, spec.tools, spec.tool_choice, c))
            result["bare"].append({"mode": mode, **r})
            print(f"{kind} bare {mode} c={c}: {r}", file=sys.stderr, flush=True)
        for n in args.sizes:
            cell = play(alias, n, args, env, out)
            result["dphil"].append({"mode": mode, **cell})
            print(f"{kind} dphil {mode} n={n}: {cell}", file=sys.stderr, flush=True)
    return result


def transformers_registry(path: Path, server: LocalServer, llamacpp: Registry) -> dict[str, str]:
    """`transformers serve` answers to its directory's path: a registry written for it, with the
    llama.cpp entries' text parameters (tools on means tools sent, replies read as text)."""
    text = llamacpp.resolve(LLAMACPP_ALIASES["text"]).params
    params = "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in text.items()) + " }"
    path.write_text(
        f'[models.gemma-3-270m-transformers]\nmodel = "hosted_vllm/{server.model}"\napi_base = "{server.url}"\n'
        f"params = {params}\n\n"
        f'[models.gemma-3-270m-transformers-text]\nmodel = "hosted_vllm/{server.model}"\n'
        f'api_base = "{server.url}"\ntools = false\nparams = {params}\n'
    )
    return {"tools": "gemma-3-270m-transformers", "text": "gemma-3-270m-transformers-text"}


def llamacpp_registry(server: LocalServer, out: Path, registry: Registry) -> tuple[dict, Registry, dict]:
    """The built-in llama.cpp entries, pointed at this server by their URL variable."""
    return LLAMACPP_ALIASES, registry, {"DPHIL_GEMMA_LLAMACPP_URL": server.url}


def transformers_server_registry(server: LocalServer, out: Path, registry: Registry) -> tuple[dict, Registry, dict]:
    reg = out / "transformers.toml"
    aliases = transformers_registry(reg, server, registry)
    return aliases, Registry.load([reg], use_env=False), {"DPHIL_MODELS": str(reg)}


# How the bench names each server of `dphil.serving.processes.SERVERS` to dphil-rollout: a server
# added there without an entry here fails `choices()` (and tests/test_extension_points.py).
REGISTRIES = {"llamacpp": llamacpp_registry, "transformers": transformers_server_registry}


def choices() -> list[str]:
    missing = set(SERVERS) - set(REGISTRIES)
    if missing:
        raise SystemExit(f"bench_servers: no registry for server(s) {', '.join(sorted(missing))}")
    return list(SERVERS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", default=",".join(choices()), help="comma-separated, from: " + ", ".join(choices()))
    ap.add_argument("--episodes", type=int, default=3)
    ap.add_argument("--prompt", default="default", help="dphil's prompt variant (minimal: half the tokens)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="3,5")
    ap.add_argument("--parallel", type=int, default=3, help="llama.cpp slots and dphil's --concurrency")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "servers"))
    args = ap.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    episodes = out / "episodes.jsonl"
    episodes.unlink(missing_ok=True)
    gguf = dphil("dphil-weights", "--gguf-only", "-q").stdout.decode().strip()
    hf_dir = dphil("dphil-weights", "-q").stdout.decode().strip()
    registry = Registry.load(use_env=False)
    results = []
    env = {"DPHIL_MODELS": ""}
    weights = {"gguf": gguf, "hf": hf_dir}
    for name in args.servers.split(","):
        kind = SERVERS[name]
        with kind.start(weights[kind.weights], parallel=args.parallel, threads=args.threads) as server:
            aliases, reg, extra_env = REGISTRIES[name](server, out, registry)
            results.append(bench_server(kind.label, server, aliases, reg, args, {**env, **extra_env}, episodes))
    sizes = ",".join(map(str, args.sizes))
    base = dphil(
        "dphil-rollout",
        *[a for m in BASELINES for a in ("-m", m)],
        "-n",
        sizes,  # same seeds
        "--episodes",
        str(args.episodes),
        "--rounds",
        str(args.rounds),
        "-q",
    )
    all_episodes = episodes.read_bytes() + base.stdout
    tables = {}
    for reward in ("paper", "shaped"):
        scored = dphil("dphil-score", "--reward", reward, "-q", stdin=all_episodes).stdout
        (out / f"episodes.scored.{reward}.jsonl").write_bytes(scored)
        tables[reward] = dphil(
            "dphil-stats", "-", "--by", "model,n", "--format", "markdown", "-q", stdin=scored
        ).stdout.decode()
    episodes.unlink()
    summary = {
        "episodes_per_cell": args.episodes,
        "rounds": args.rounds,
        "sizes": args.sizes,
        "prompt": args.prompt,
        "load_average_at_end": os.getloadavg(),
        "servers": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "| server | mode | N | legal | null | calls/s | completion tok/s | s/episode | bare calls/s | dphil/bare |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        bare = {b["mode"]: b for b in r["bare"] if b["concurrency"] == r["parallel"]}
        for d in r["dphil"]:
            b = bare[d["mode"]]
            lines.append(
                f"| {r['server']} | {d['mode']} | {d['n']} | {d['legal_share']:.0%} | {d['null_share']:.0%} "
                f"| {d['calls_per_s']:.3f} | {d['completion_tokens_per_s']:.1f} | {d['s_per_episode']:.0f} "
                f"| {b['calls_per_s']:.3f} | {d['calls_per_s'] / b['calls_per_s']:.2f} |"
            )
    bare_lines = [
        "| server | mode | concurrency | calls/s | completion tok/s | prompt tok/s |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for b in r["bare"]:
            bare_lines.append(
                f"| {r['server']} | {b['mode']} | {b['concurrency']} | {b['calls_per_s']:.3f} "
                f"| {b['completion_tokens_per_s']:.1f} | {b['prompt_tokens_per_s']:.0f} |"
            )
    md = "\n".join(
        [
            "## dphil-rollout",
            *lines,
            "",
            "## bare loop",
            *bare_lines,
            "",
            "## paper reward",
            tables["paper"],
            "## shaped reward",
            tables["shaped"],
        ]
    )
    (out / "summary.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
