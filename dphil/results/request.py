"""Running `dphil-stats`: read scored episodes, summarise the cells, compare them, write the report."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dphil.io.console import Console
from dphil.io.errors import UsageError
from dphil.io.jsonl import RecordWriter
from dphil.results import cells, comparisons, fields, frame, report


@dataclass(frozen=True)
class StatsRequest:
    """What `dphil-stats` was asked for (see commands/stats.py for the meaning of each option)."""

    inputs: tuple[str, ...] = ()  # files, or - for stdin; none: stdin
    by: str = ",".join(fields.DEFAULT_BY)  # FIELD[,FIELD...]
    compares: tuple[tuple[str, str, str], ...] = ()  # (FIELD, A, B): B against A
    adjust: str = "holm"  # holm, bh or none
    power: bool = False
    effect: float | None = None  # plan the power for this Hedges' g (implies power)
    fmt: str = "jsonl"  # jsonl, markdown, csv, table or html
    timelines: int | None = None  # html: episodes drawn per cell [default: html_report.DEFAULT_TIMELINES]
    no_cells: bool = False  # only the comparisons
    plot: str | None = None  # also draw the cells to this picture
    degenerate_warn: float = cells.DEGENERATE_WARN
    output: str | None = None
    on_error: str = "fail"  # fail (exit 65 at the first bad line) or skip


def run_stats(req: StatsRequest, console: Console) -> int:
    """Check the request, read the inputs, write the cell and comparison records (or a report); exit status."""
    by = fields.parse_by(req.by)
    wanted = [comparisons.Compare(f, a, b) for f, a, b in req.compares]
    fields.check_fields([c.field for c in wanted])
    if req.effect is not None and not math.isfinite(req.effect):
        raise UsageError("--effect must be a finite number")
    if req.plot:
        report.check_plot(req.plot)
    if req.timelines is not None and req.fmt != "html":
        raise UsageError("--timelines goes with --format html")
    if req.timelines is not None and req.no_cells:
        raise UsageError("--timelines shows episodes per cell: not with --no-cells")
    sample = None
    if req.fmt == "html" and not req.no_cells:  # the timelines are per cell: none without cells
        from dphil.results.html_report import DEFAULT_TIMELINES, EpisodeSample

        sample = EpisodeSample(by, DEFAULT_TIMELINES if req.timelines is None else req.timelines)
    episodes = frame.load(
        req.inputs, [*by, *(c.field for c in wanted)], on_error=req.on_error, warn=console.warn, keep=sample
    )
    if episodes.skipped:
        console.error(f"skipped {episodes.skipped} bad record(s)")
    if episodes.frame.height == 0:
        console.warn("no episodes in the input: nothing to summarise")
        return 0
    cell_list = cells.cell_records(episodes, by, degenerate_warn=req.degenerate_warn, warn=console.warn)
    comps = comparisons.comparison_records(
        episodes,
        by,
        wanted,
        adjust=req.adjust,
        power=req.power or req.effect is not None,
        effect=req.effect,
        warn=console.warn,
    )
    shown = [] if req.no_cells else cell_list
    if req.plot:
        report.plot(cell_list, by, req.plot)
    with RecordWriter(req.output) as writer:
        if req.fmt == "jsonl":
            for record in [*shown, *comps]:
                writer.write(record)
        elif req.fmt == "html":
            from dphil.results.html_report import render_page

            page = render_page(
                cell_list,
                comps,
                by,
                sources=list(req.inputs),
                sample=sample,
                compared=bool(wanted),
                no_cells=req.no_cells,
            )
            writer.write_line(page.encode())
        else:
            text = report.render(req.fmt, shown, comps, by)
            for line in text.splitlines(keepends=True):
                writer.write_line(line.encode())
    return 0
