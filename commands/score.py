"""dphil-score: replay episodes, check them, and attach the reward and metrics."""

from __future__ import annotations

import click
from dphil.commands._common import (
    command,
    execute,
    inputs_argument,
    on_error_option,
    output_option,
    quiet_option,
    wait_lock_option,
)

HELP = """Score episodes: replay each record's turns, check its outcome, add reward and metrics.

Reads episode JSONL from FILEs or stdin (plain or gzip), writes each record with
`reward` and `metrics` replaced. Errored episodes pass through with reward null.

\b
  paper  (default) r = a*no_deadlock + b*throughput - g*fairness - d*idle, as published:
         a table where nobody acts scores exactly 1.0.
  shaped no_deadlock counts only with at least --min-meals meals; null actions are idle:
         doing nothing scores -d.

\b
  dphil-rollout -m scripted:naive -n 5 | dphil-score --shaped > ep.jsonl
  dphil-score --reward paper --beta 1.0 old-logs/*.jsonl.gz -o rescored.jsonl
"""


@command("dphil-score", help=HELP)
@inputs_argument
@click.option(
    "--reward", "variant", type=click.Choice(["paper", "shaped"]), default=None, help="Reward variant [default: paper]."
)
@click.option("--shaped", is_flag=True, help="Same as --reward shaped.")
@click.option("--alpha", type=float, default=1.0, show_default=True, help="Weight of no_deadlock.")
@click.option("--beta", type=float, default=0.5, show_default=True, help="Weight of throughput.")
@click.option("--gamma", type=float, default=0.3, show_default=True, help="Weight of the fairness penalty.")
@click.option("--delta", type=float, default=0.1, show_default=True, help="Weight of the idle penalty.")
@click.option(
    "--min-meals",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="shaped: meals needed before no_deadlock pays.",
)
@click.option("--trust-outcome", is_flag=True, help="Score the recorded meals/deadlock without replaying the turns.")
@output_option
@wait_lock_option
@on_error_option
@quiet_option
def main(
    inputs, variant, shaped, alpha, beta, gamma, delta, min_meals, trust_outcome, output, wait_lock, on_error, quiet
):
    from dphil.io.errors import DataError, UsageError
    from dphil.io.jsonl import RecordReader, RecordWriter
    from dphil.scoring.reward import RewardSpec
    from dphil.scoring.score import Scorer

    def body(console):
        if shaped and variant == "paper":
            raise UsageError("--shaped contradicts --reward paper")
        try:
            spec = RewardSpec(
                variant="shaped" if shaped else (variant or "paper"),
                alpha=alpha,
                beta=beta,
                gamma=gamma,
                delta=delta,
                min_meals=min_meals,
            )
        except ValueError as e:
            raise UsageError(str(e)) from None
        scorer = Scorer(spec, trust_outcome=trust_outcome)
        reader = RecordReader(inputs, on_error=on_error, warn=console.warn)
        with RecordWriter(output) as writer:
            for record in reader:
                try:
                    scored = scorer.line(record, reader.raw)
                except DataError as e:
                    reader.reject(e)
                    continue
                writer.write_line(scored)
        if reader.skipped:
            console.error(f"skipped {reader.skipped} bad record(s)")
        return 0

    return execute("dphil-score", quiet, body, outputs=(output,), wait_lock=wait_lock)


if __name__ == "__main__":
    main()
