"""dphil-stats: per-cell results tables and the significance tests between cells."""

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

HELP = """Summarise scored episodes per cell and test the differences between cells.

Reads scored episodes (dphil-score output) from FILEs or stdin and writes one
`kind: "cell"` record per value of the --by fields (mean reward with its 95% t
interval, deadlock rate with its Wilson interval, meals, degenerate and null-action
rates, tokens, cost), then one `kind: "comparison"` record per --compare and group:
Welch's t (Welch-Satterthwaite df), Hedges' g with its 95% CI, the deadlock-rate
difference (z test, or Fisher's exact for small counts) and, when both arms share
seeds, the paired t, Wilcoxon signed-rank and McNemar tests; with --cluster, Welch's
t over clusters (training runs) too. p values of several
comparisons are Holm-adjusted (--adjust). Errored episodes are counted and left out.

\b
  dphil-stats ep.jsonl --format markdown
  dphil-stats runs/*.jsonl --compare model qwen3-14b qwen3-14b-grpo --power
  dphil-stats ep.jsonl --by model,n,prompt --compare prompt v1 v2 --plot reward.png
  dphil-stats ep.jsonl --compare model scripted:naive scripted:hierarchy --format html -o report.html
  dphil-stats test.jsonl --by recipe,n --compare recipe study dphil --cluster run
"""


@command("dphil-stats", help=HELP)
@inputs_argument
@click.option(
    "--by",
    default="model,n",
    show_default=True,
    metavar="FIELD[,FIELD...]",
    help="Top-level fields that define a cell (e.g. model,n,protocol,checkpoint_step).",
)
@click.option(
    "--compare",
    "compares",
    nargs=3,
    multiple=True,
    metavar="FIELD A B",
    help="Compare cells where FIELD is B against those where it is A, within each group "
    "of the other --by fields. Repeatable.",
)
@click.option(
    "--adjust",
    type=click.Choice(["holm", "bh", "none"]),
    default="holm",
    show_default=True,
    help="Multiplicity adjustment of p values across comparisons.",
)
@click.option(
    "--cluster",
    default=None,
    metavar="FIELD",
    help="Also test each comparison over the clusters of FIELD (e.g. run: one unit per training run, "
    "its episodes' mean); an episode without FIELD is a unit of its own. Episodes of one trained "
    "model are not independent draws of its recipe; its training runs are.",
)
@click.option(
    "--power",
    is_flag=True,
    help="Add the episodes per arm needed to detect the observed g (alpha 0.05, power "
    "0.8) and the smallest g the current arms can detect.",
)
@click.option(
    "--effect",
    type=float,
    default=None,
    metavar="G",
    help="Plan --power for this Hedges' g instead of the observed one (implies --power).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "markdown", "csv", "table", "html"]),
    default="jsonl",
    show_default=True,
    help="Records, a table for papers/terminals, or html: one self-contained page with "
    "the tables, the plots and episode timelines.",
)
@click.option(
    "--timelines",
    type=click.IntRange(min=0),
    default=None,
    metavar="K",
    help="html: draw the first K complete episodes of each cell [default: 3; 0: none].",
)
@click.option("--no-cells", is_flag=True, help="Write only the comparisons.")
@click.option(
    "--plot",
    metavar="FILE",
    default=None,
    help="Also draw mean reward and deadlock rate with CIs per cell to FILE (.png/.svg/.pdf; needs matplotlib).",
)
@click.option(
    "--degenerate-warn",
    type=click.FloatRange(0.0, 1.0),
    default=0.25,
    show_default=True,
    metavar="RATE",
    help="Warn on stderr about cells where at least this share of episodes has no deadlock and no meals.",
)
@click.option(
    "--wide",
    is_flag=True,
    help="--format table in one piece, however wide (by default it wraps into blocks of 100 columns, "
    "each repeating the cell's fields).",
)
@click.option(
    "--dedupe",
    type=click.Choice(["fail", "first"]),
    default="fail",
    show_default=True,
    help="An episode_id read complete before (the same file twice, overlapping shards): fail names both "
    "lines (exit 65); first keeps the first and reports how many repeats were dropped on stderr. "
    "Either way an errored attempt of an episode read again (a --resume retry) is left out and counted.",
)
@output_option
@wait_lock_option
@on_error_option
@quiet_option
def main(
    inputs,
    by,
    compares,
    adjust,
    cluster,
    power,
    effect,
    fmt,
    timelines,
    no_cells,
    plot,
    degenerate_warn,
    wide,
    dedupe,
    output,
    wait_lock,
    on_error,
    quiet,
):
    def body(console):
        from dphil.results.request import StatsRequest, run_stats

        request = StatsRequest(
            inputs=inputs,
            by=by,
            compares=compares,
            adjust=adjust,
            cluster=cluster,
            power=power,
            effect=effect,
            fmt=fmt,
            timelines=timelines,
            no_cells=no_cells,
            plot=plot,
            degenerate_warn=degenerate_warn,
            wide=wide,
            output=output,
            on_error=on_error,
            dedupe=dedupe,
        )
        return run_stats(request, console)

    return execute("dphil-stats", quiet, body, outputs=(output,), wait_lock=wait_lock)
