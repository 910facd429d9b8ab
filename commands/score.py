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
    reward_options,
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
@reward_options
@click.option("--trust-outcome", is_flag=True, help="Score the recorded meals/deadlock without replaying the turns.")
@output_option
@wait_lock_option
@on_error_option
@quiet_option
def main(inputs, reward, trust_outcome, output, wait_lock, on_error, quiet):
    def body(console):
        from dphil.scoring.request import ScoreRequest, run_score

        request = ScoreRequest(
            inputs=inputs, reward=reward, trust_outcome=trust_outcome, output=output, on_error=on_error
        )
        return run_score(request, console)

    return execute("dphil-score", quiet, body, outputs=(output,), wait_lock=wait_lock)


if __name__ == "__main__":
    main()
