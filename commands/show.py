"""dphil-show: look at episodes as timelines (text, SVG, a self-contained HTML page)."""

from __future__ import annotations

import click
from dphil.commands._common import command, execute, inputs_argument, quiet_option, wait_lock_option

HELP = """Show episodes as timelines (one row per philosopher, one column per round), or a run as a curve.

Reads episode JSONL (scored or not) from FILEs or stdin, plain or gzip. Each
cell shows what a philosopher held after the round (no fork, left, right,
both) or that it ate; failed and null actions and deadlock rounds are marked,
the reward terms of scored episodes are shown underneath. Records that are not
episodes are skipped with a warning naming the line. The input is read only
as far as needed: `-e 0` on a huge file returns at once.

As svg or png, an input that starts with checkpoint records (dphil-train
output, and dphil-ckpt-select output with its `selection`) is drawn as the
run's training curve instead: train and validation reward per step, one colour
per run, the chosen step ringed.

\b
  text  (default; also when piped, then without colour) the first episode, or
        each --episode, or --all of them.
  svg   one SVG picture: to stdout or -o FILE.svg; with -o DIR/ one file per
        episode, DIR/<episode_id>.svg, for every episode (or each --episode).
  html  one self-contained page (no network needed): every episode (up to
        --limit), filterable by model, N and status; click a cell for that
        turn's raw reply and tool call.
  png   checkpoint records only (as is svg for them): the training curve.
  The format defaults to the suffix of -o (.svg, .png, .html, a directory: svg).

\b
  dphil-show ep.jsonl                         # the first episode
  dphil-show ep.jsonl -e 3 -e 950c3e5b67bc292d  # the fourth episode, and one by id
  dphil-rollout -m scripted:naive -n 5 | dphil-score | dphil-show --all --color always | less -R
  dphil-show ep.jsonl -e 0 -o ep0.svg
  dphil-show ep.jsonl -o timelines/           # one SVG per episode
  dphil-show ep.jsonl -o episodes.html
  dphil-show ckpts.jsonl best.jsonl -o curve.png   # dphil-train + dphil-ckpt-select output
"""

FORMATS = ("text", "svg", "html", "png")


@command("dphil-show", help=HELP)
@inputs_argument
@click.option(
    "-f",
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="Output format [default: from the suffix of -o, else text].",
)
@click.option(
    "-e",
    "--episode",
    "episodes",
    multiple=True,
    metavar="ID|INDEX",
    help="An episode id, or an index (0 is the first episode record of the input). "
    "Repeatable; shown in input order. Unknown ones exit 65.",
)
@click.option("--all", "every", is_flag=True, help="text: every episode, one after another (up to --limit).")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Show at most this many episodes with --all, html or svg -o DIR (0: no limit).",
)
@click.option(
    "--color",
    type=click.Choice(["auto", "always", "never"]),
    default="auto",
    show_default=True,
    help="Colour text: auto means only when stdout is a terminal (and NO_COLOR is unset).",
)
@click.option(
    "-o",
    "--output",
    metavar="FILE|DIR",
    default=None,
    help="Write to FILE (atomically: a temporary file renamed on success), or for svg one "
    "file per episode into DIR (an existing directory, or a path ending in /).",
)
@wait_lock_option
@quiet_option
def main(inputs, fmt, episodes, every, limit, color, output, wait_lock, quiet):
    def body(console):
        from dphil.show.choose import ShowRequest, show

        return show(
            ShowRequest(
                inputs=list(inputs),
                fmt=fmt,
                episodes=list(episodes),
                every=every,
                limit=limit or None,
                color=color,
                output=output,
            ),
            console,
        )

    return execute("dphil-show", quiet, body, outputs=(output,), wait_lock=wait_lock)


if __name__ == "__main__":
    main()
