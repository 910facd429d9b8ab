"""dphil-rollout: play episodes at the table and write one JSON line per episode."""

from __future__ import annotations

import os

import click

from dphil.table import CONFLICTS, DEADLOCK_MODES, PROTOCOLS, SCHEDULES

from ._common import command, execute, quiet_option

HELP = """Play episodes of the dining philosophers and write them as JSONL.

Runs every combination of -m MODEL, -n SIZE and seed, one episode per line on
stdout (or -o FILE) as each finishes. Built-in policies need no network:
scripted:random, scripted:naive, scripted:hierarchy, scripted:idle,
scripted:thinker, scripted:greedy. Any other MODEL is a language model: an
alias from the model registry (claude-opus-4.7, gpt-5.4, gemini-3.1-pro,
grok-4.2, mistral-small-24b, qwen3-14b, qwen3-8b, deepseek-r1-distill-qwen-7b,
or your own via --models) or a litellm id such as openai/gpt-5.4. A model call
that fails after its retries ends that episode with status "error"; the run
then exits 75 and a rerun with --resume retries it.

\b
  dphil-rollout -m scripted:naive -n 5 --episodes 30 | dphil-score --shaped > ep.jsonl
  dphil-rollout -m scripted:hierarchy -m scripted:random -n 5,10,15 -o grid.jsonl --resume
  dphil-rollout -m qwen3-14b -n 5 --episodes 30 --concurrency 32 -o qwen.jsonl --resume
"""


@command("dphil-rollout", help=HELP)
@click.option("-m", "--model", "models", multiple=True, required=True, metavar="MODEL",
              help="Policy or model to seat at the table; repeat for a grid.")
@click.option("-n", "--philosophers", "sizes", default="5", show_default=True, metavar="N[,N...]",
              help="Table size(s), e.g. 5 or 5,10,15.")
@click.option("--episodes", type=click.IntRange(min=1), default=30, show_default=True,
              help="Episodes per model and table size (seeds SEED..SEED+EPISODES-1).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Base seed: episode k of every cell gets seed SEED+k.")
@click.option("--seeds", default=None, metavar="LIST",
              help="Explicit seeds instead of --seed/--episodes, e.g. 1000-1029 or 1,5,9.")
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True,
              help="Rounds per episode; every philosopher acts once per round.")
@click.option("--protocol", type=click.Choice(list(PROTOCOLS)), default="paper", show_default=True,
              help="paper: the study's six tools. dpbench: DPBench's four actions.")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="simultaneous", show_default=True,
              help="simultaneous: all choose from one snapshot. sequential: one at a time.")
@click.option("--conflict", type=click.Choice(CONFLICTS), default="random", show_default=True,
              help="Who gets a free fork two neighbours reach for in the same round.")
@click.option("--deadlock", "deadlock_mode", type=click.Choice(DEADLOCK_MODES), default="terminal",
              show_default=True, help="terminal: a deadlock ends the episode. continue: play on.")
@click.option("-o", "--output", metavar="FILE", default=None,
              help="Append episodes to FILE as they finish (whole lines only). An existing FILE "
                   "needs --resume.")
@click.option("--resume", is_flag=True,
              help="With -o: skip episodes already complete in FILE, rerun errored ones, append.")
@click.option("--shard", default=None, metavar="I/K",
              help="Run only shard I of K (0-based, e.g. $SLURM_ARRAY_TASK_ID/4); the K shards "
                   "together are the whole grid with the same episode ids.")
@click.option("--models", "registries", multiple=True, metavar="FILE",
              help="Model registry (TOML) merged over the built-in aliases; repeatable. Also "
                   "read from $DPHIL_MODELS.")
@click.option("--prompt", type=click.Choice(["default", "minimal", "resource-ordering",
                                             "symmetry-breaking"]),
              default="default", show_default=True, help="System prompt variant for models.")
@click.option("--prompt-file", default=None, metavar="FILE",
              help="Your own system-prompt template ($seat, $n, $rules, $actions, $answer, ...).")
@click.option("--memory", default="full", show_default=True, metavar="full|window:K|none",
              help="How much of its own past each model agent re-reads.")
@click.option("--talk", type=click.IntRange(min=0), default=0, show_default=True, metavar="K",
              help="K rounds of messages to the two neighbours before each action.")
@click.option("--concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              help="Model calls in flight at once, across all episodes.")
@click.option("--rpm", type=click.IntRange(min=1), default=None,
              help="At most this many model calls per minute.")
@click.option("--tpm", type=click.IntRange(min=1), default=None,
              help="At most this many tokens per minute.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=120.0,
              show_default=True, help="Seconds before one model call is abandoned (and retried).")
@click.option("--retries", type=click.IntRange(min=0), default=4, show_default=True,
              help="Retries of a failed call (exponential backoff with jitter, honouring "
                   "Retry-After) before its episode ends with status error.")
@click.option("--max-errors", type=click.IntRange(min=1), default=None, metavar="N",
              help="Abort the run after N episodes ended in error (exit 69).")
@click.option("--cost-limit", type=click.FloatRange(min=0), default=None, metavar="USD",
              help="Start no new episode once this much has been spent (litellm's prices).")
@quiet_option
def main(models, sizes, episodes, seed, seeds, rounds, protocol, schedule, conflict, deadlock_mode,
         output, resume, shard, registries, prompt, prompt_file, memory, talk, concurrency, rpm,
         tpm, timeout, retries, max_errors, cost_limit, quiet):
    from dphil.errors import OutputError, UsageError
    from dphil.jsonl import RecordWriter
    from dphil.policies import POLICIES
    from dphil.rollout import (
        Grid,
        RunStats,
        completed_ids,
        is_scripted,
        parse_int_list,
        parse_shard,
        run_scripted,
        scripted_name,
    )
    from dphil.rollout import (
        shard as shard_configs,
    )

    def body(console):
        table_sizes = parse_int_list(sizes, "-n")
        if min(table_sizes) < 2:
            raise UsageError("-n: a table needs at least 2 philosophers")
        seed_list = parse_int_list(seeds, "--seeds") if seeds else list(range(seed, seed + episodes))
        for model in models:
            if is_scripted(model) and scripted_name(model) not in POLICIES:
                known = ", ".join(f"scripted:{p}" for p in POLICIES)
                raise UsageError(f"unknown scripted policy {model!r} (known: {known})")
        llm_models = [m for m in dict.fromkeys(models) if not is_scripted(m)]
        plan = None
        if llm_models:
            from dphil.agents.runner import plan_models

            plan = plan_models(llm_models, registry_files=registries, prompt=prompt,
                               prompt_file=prompt_file, memory=memory, talk=talk)
        grid = Grid(models=list(models), sizes=table_sizes, seeds=seed_list, rounds=rounds,
                    protocol=protocol, schedule=schedule, conflict=conflict,
                    deadlock_mode=deadlock_mode, variants=plan.variants if plan else {})
        which = parse_shard(shard)
        done: set[str] = set()
        if output is not None and output != "-":
            if os.path.exists(output) and not resume:
                raise OutputError(f"{output} exists: pass --resume to finish it, or choose another file",
                                  exit_code=73)
            if resume:
                done = completed_ids(output, warn=console.warn)
        elif resume:
            raise UsageError("--resume needs -o FILE")
        writer = RecordWriter(output, mode="append", line_buffered=plan is not None)
        stats = RunStats()
        llm_stats = None
        bar = None
        try:
            configs = list(shard_configs(grid.configs(), which))
            if console.show_progress:
                from tqdm import tqdm

                bar = tqdm(total=len(configs), unit="ep", desc="episodes", file=console.stderr)
            run_scripted([c for c in configs if is_scripted(c.model)], writer.write, done=done,
                         stats=stats, progress=bar.update if bar is not None else None)
            if plan is not None:
                from dphil.agents.llm import Limits
                from dphil.agents.runner import run_models

                llm_stats = run_models(
                    [c for c in configs if not is_scripted(c.model)], plan.specs, plan.settings,
                    writer.write, done=done, max_errors=max_errors, cost_limit=cost_limit,
                    limits=Limits(concurrency=concurrency, rpm=rpm, tpm=tpm, timeout=timeout,
                                  retries=retries),
                    progress=_llm_progress(bar),
                )
        except BaseException:
            writer.close(success=False)
            raise
        finally:
            if bar is not None:
                bar.close()
        writer.close()
        if stats.skipped_done:
            console.warn(f"{stats.skipped_done} episode(s) already complete in {output}; "
                         f"wrote {stats.written}")
        if llm_stats is not None:
            return _llm_summary(console, llm_stats, output)
        return 0

    return execute("dphil-rollout", quiet, body)


def _llm_progress(bar):
    """Progress callback for model runs: the bar shows errors, tokens and cost as they grow."""
    if bar is None:
        return None

    def progress(record, stats):
        bar.update(1)
        bar.set_postfix(errors=stats.errors,
                        tokens=stats.usage.prompt_tokens + stats.usage.completion_tokens,
                        cost=f"${stats.usage.cost:.4f}", refresh=False)

    return progress


def _llm_summary(console, stats, output):
    """Closing lines of a model run; exit 75 (try again) when episodes are left to do."""
    from dphil.errors import EX_TEMPFAIL

    u = stats.usage
    if stats.skipped_done:
        console.warn(f"{stats.skipped_done} model episode(s) already complete in {output}")
    console.warn(f"model episodes: {stats.written} written, {stats.errors} errored; "
                 f"{u.calls} calls, {u.prompt_tokens + u.completion_tokens} tokens, "
                 f"${u.cost:.4f}")
    if stats.not_started:
        console.error(f"cost limit reached: {stats.not_started} episode(s) not started; "
                      "rerun with --resume to continue")
    if stats.errors:
        console.error(f"{stats.errors} episode(s) ended in error (last: {stats.last_error}); "
                      "rerun with --resume to retry them")
    return EX_TEMPFAIL if stats.errors or stats.not_started else 0
