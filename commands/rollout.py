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
scripted:thinker, scripted:greedy.

\b
  dphil-rollout -m scripted:naive -n 5 --episodes 30 | dphil-score --shaped > ep.jsonl
  dphil-rollout -m scripted:hierarchy -m scripted:random -n 5,10,15 -o grid.jsonl --resume
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
@quiet_option
def main(models, sizes, episodes, seed, seeds, rounds, protocol, schedule, conflict, deadlock_mode,
         output, resume, shard, quiet):
    from dphil.errors import OutputError, UsageError
    from dphil.jsonl import RecordWriter
    from dphil.policies import POLICIES
    from dphil.rollout import (
        Grid, RunStats, completed_ids, is_scripted, parse_int_list, parse_shard, run_scripted,
        scripted_name, shard as shard_configs,
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
            if not is_scripted(model):
                raise UsageError(
                    f"model {model!r}: only scripted policies are available in this build "
                    "(scripted:random, scripted:naive, ...)"
                )
        grid = Grid(models=list(models), sizes=table_sizes, seeds=seed_list, rounds=rounds,
                    protocol=protocol, schedule=schedule, conflict=conflict,
                    deadlock_mode=deadlock_mode)
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
        writer = RecordWriter(output, mode="append")
        stats = RunStats()
        bar = None
        try:
            configs = list(shard_configs(grid.configs(), which))
            if console.show_progress:
                from tqdm import tqdm

                bar = tqdm(total=len(configs), unit="ep", desc="episodes", file=console.stderr)
            run_scripted(configs, writer.write, done=done, stats=stats,
                         progress=bar.update if bar is not None else None)
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
        return 0

    return execute("dphil-rollout", quiet, body)
