"""dphil-ckpt-select: choose the checkpoint to keep, show why, hand it down the pipe."""

from __future__ import annotations

import click
from dphil.commands._common import command, execute, inputs_argument, output_option, quiet_option, wait_lock_option

HELP = """Choose which checkpoint to keep, instead of the last one.

Reads `kind: "checkpoint"` records (from dphil-train, or hand-written with run,
step, path, train_reward) and, optionally, scored validation episodes tagged with
`checkpoint_step`, mixed in any order, from FILEs or stdin (`-`). Writes the
chosen checkpoint record(s) unchanged plus a `selection` object: by, metric,
score, ci, candidates, last_step, last_score, last_rank - what keeping the last
step would have cost.

\b
  --by last   the last step (the published recipe, for comparison)
  --by train  best training score in the checkpoint records
  --by val    best mean over validation episodes (default when there are any)

\b
The chosen adapter directory must exist when its record names one (exit 66
if it is gone; --no-check-path skips this). --export and --merge also check
its adapter_config.json against the record's base_model and lora_rank.

\b
  dphil-ckpt-select --by train ckpts.jsonl
  dphil-rollout --checkpoints ckpts.jsonl --seeds 1000-1029 | dphil-score --shaped \\
    | dphil-ckpt-select --by val --metric reward --rule one-se ckpts.jsonl - > best.jsonl
  dphil-ckpt-select ckpts.jsonl val.jsonl --smooth 3 --plot curve.png --export best-adapter/
"""


@command("dphil-ckpt-select", help=HELP)
@inputs_argument
@click.option(
    "--by",
    type=click.Choice(["last", "train", "val"]),
    default=None,
    help="Where scores come from [default: val if validation scores exist, else train].",
)
@click.option(
    "--metric",
    type=click.Choice(["reward", "meals", "deadlock_rate", "throughput"]),
    default="reward",
    show_default=True,
    help="What to rank on; deadlock_rate is minimised, the others maximised.",
)
@click.option(
    "--smooth",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="K",
    help="Rank on a centred moving average over K consecutive checkpoints (K odd).",
)
@click.option(
    "--rule",
    type=click.Choice(["best", "one-se"]),
    default="best",
    show_default=True,
    help="best: highest score. one-se: earliest checkpoint within one standard error of the best.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="K",
    help="Write the K best checkpoints in the rule's order (for retention scripts).",
)
@click.option(
    "--run", "run_name", default=None, metavar="NAME", help="Select within this run only when several are mixed."
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    metavar="FILE.png",
    help="Draw the train/validation curves with the chosen and the last step marked (needs matplotlib).",
)
@click.option(
    "--export",
    "export_dir",
    type=click.Path(file_okay=False, path_type=str),
    default=None,
    metavar="DIR",
    help="Copy the chosen adapter to DIR (atomically; DIR must not exist or be empty).",
)
@click.option(
    "--merge",
    is_flag=True,
    help="With --export: write the base model with the adapter merged in (peft "
    "merge_and_unload) instead of the adapter.",
)
@click.option(
    "--base-model",
    default=None,
    metavar="PATH",
    help="With --merge: load the base weights from here (a local copy of the record's base_model).",
)
@click.option(
    "--no-check-path",
    is_flag=True,
    help="Do not require the chosen adapter directory to exist (selecting from logs on another machine).",
)
@output_option
@wait_lock_option
@quiet_option
def main(
    inputs,
    by,
    metric,
    smooth,
    rule,
    top,
    run_name,
    plot,
    export_dir,
    merge,
    base_model,
    no_check_path,
    output,
    wait_lock,
    quiet,
):
    def body(console):
        from dphil.checkpoints.request import SelectRequest, run_select

        request = SelectRequest(
            inputs=inputs,
            by=by,
            metric=metric,
            smooth=smooth,
            rule=rule,
            top=top,
            run=run_name,
            plot=plot,
            export_dir=export_dir,
            merge=merge,
            base_model=base_model,
            check_path=not no_check_path,
            output=output,
        )
        return run_select(request, console)

    return execute("dphil-ckpt-select", quiet, body, outputs=(output,), wait_lock=wait_lock)
