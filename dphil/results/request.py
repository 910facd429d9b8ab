"""Running `dphil-stats`: read scored episodes, summarise the cells, compare them, write the report."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dphil.io.console import Console, output_name
from dphil.io.errors import UsageError
from dphil.io.jsonl import RecordWriter, check_sources
from dphil.results import fields, figure, report


@dataclass(frozen=True)
class StatsRequest:
    """What `dphil-stats` was asked for (see commands/stats.py for the meaning of each option)."""

    inputs: tuple[str, ...] = ()  # files, or - for stdin; none: stdin
    by: str = ",".join(fields.DEFAULT_BY)  # FIELD[,FIELD...]
    compares: tuple[tuple[str, str, str], ...] = ()  # (FIELD, A, B): B against A
    adjust: str = "holm"  # holm, bh or none
    cluster: str | None = None  # also test the comparisons over this field's clusters (e.g. run)
    power: bool = False
    effect: float | None = None  # plan the power for this Hedges' g (implies power)
    fmt: str = "jsonl"  # jsonl, markdown, csv, table or html
    timelines: int | None = None  # html: episodes drawn per cell [default: html_report.DEFAULT_TIMELINES]
    no_cells: bool = False  # only the comparisons
    plot: str | None = None  # also draw the cells to this picture
    degenerate_warn: float = fields.DEGENERATE_WARN
    wide: bool = False  # the terminal table in one piece, however wide
    width: int = 100  # otherwise it wraps into column blocks of this width
    output: str | None = None
    on_error: str = "fail"  # fail (exit 65 at the first bad line) or skip
    dedupe: str = "fail"  # a repeated episode_id: fail (exit 65 naming both lines) or keep the first


def run_stats(req: StatsRequest, console: Console) -> int:
    """Check the request, read the inputs, write the cell and comparison records (or a report); exit status."""
    by = fields.parse_by(req.by)
    fields.check_fields([f for f, _, _ in req.compares])
    if req.effect is not None and not math.isfinite(req.effect):
        raise UsageError("--effect must be a finite number")
    if req.plot:
        figure.check_plot(req.plot)
    if req.timelines is not None and req.fmt != "html":
        raise UsageError("--timelines goes with --format html")
    if req.timelines is not None and req.no_cells:
        raise UsageError("--timelines shows episodes per cell: not with --no-cells")
    if req.cluster is not None:
        fields.check_fields([req.cluster])
        if not req.compares:
            raise UsageError("--cluster tests comparisons: give --compare too")
        if req.cluster in by or any(req.cluster == f for f, _, _ in req.compares):
            raise UsageError(f"--cluster {req.cluster}: a --by or --compare field holds one cluster a cell")
    if req.dedupe not in ("fail", "first"):
        raise UsageError(f"--dedupe is fail or first, not {req.dedupe!r}")
    check_sources(req.inputs)
    # Only now the heavy part (scipy): a usage error or a missing file is reported in a blink.
    from dphil.results import cells, comparisons, frame

    wanted = [fields.Compare(f, a, b) for f, a, b in req.compares]
    sample = None
    if req.fmt == "html" and not req.no_cells:  # the timelines are per cell: none without cells
        from dphil.results.html_report import DEFAULT_TIMELINES, EpisodeSample

        sample = EpisodeSample(by, DEFAULT_TIMELINES if req.timelines is None else req.timelines)
    episodes = frame.load(
        req.inputs,
        by,
        compares=wanted,
        arm_fields=[req.cluster] if req.cluster else [],
        on_error=req.on_error,
        dedupe=req.dedupe,
        warn=console.warn,
        keep=sample,
    )
    if episodes.skipped:
        console.error(f"skipped {episodes.skipped} bad record(s)")
    if episodes.superseded:
        console.error(
            f"left out {episodes.superseded} errored attempt(s) of episodes read again (as --resume retries them): "
            "each episode counts once"
        )
    if episodes.dropped:
        console.error(
            f"dropped {episodes.dropped} repeated episode(s): --dedupe first kept the first of each episode_id"
        )
    if episodes.count == 0:
        console.warn("no episodes in the input: nothing to summarise")
        return 0
    fields.check_present(episodes.present, episodes.count, by)
    fields.check_present(episodes.present, episodes.count, [c.field for c in wanted], option="--compare")
    if req.cluster:
        fields.check_present(episodes.present, episodes.count, [req.cluster], option="--cluster")
    cell_list = cells.cell_records(episodes, by, degenerate_warn=req.degenerate_warn, warn=console.warn)
    comps = comparisons.comparison_records(
        episodes,
        by,
        wanted,
        adjust=req.adjust,
        power=req.power or req.effect is not None,
        effect=req.effect,
        warn=console.warn,
        cluster=req.cluster,
    )
    shown = [] if req.no_cells else cell_list
    if req.plot:
        figure.plot(cell_list, by, req.plot)
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
            variants = sorted({str(c["reward_variant"]) for c in cell_list if c.get("reward_variant")})
            reward = "/".join(variants) or None
            text = report.render(req.fmt, shown, comps, by, reward=reward, width=None if req.wide else req.width)
            for line in text.splitlines(keepends=True):
                writer.write_line(line.encode())
    where = output_name(req.output)
    what = f"{len(shown)} cell(s) and {len(comps)} comparison(s)" if req.fmt in ("jsonl", "csv") else f"the {req.fmt}"
    console.report(f"wrote {what} to {where}" + (f"; the plot to {req.plot}" if req.plot else ""))
    return 0
