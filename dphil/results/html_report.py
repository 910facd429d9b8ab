"""`dphil-stats --format html`: the results as one page a reader opens without a network.

The page holds the cell table with its intervals and the comparison tests
(the same rows as `--format markdown`, from `dphil.results.report`), the reward and
deadlock-rate plot by N (inline SVG, when matplotlib is installed), and the
timelines of a few episodes of every cell (`dphil.show.svg`), linked from the
table. Everything is inline: no script or style is fetched. With `--no-cells`
the page keeps only the comparisons, as the other formats do: no cell table,
plot or timelines.

dphil-stats reads a million episodes as a polars frame of a few fields; the
page must not undo that by keeping whole episodes. `EpisodeSample` sees each
source once it has been read (`dphil.results.frame.load(keep=...)`, with the bytes
already in memory for stdin, gzip and pipes) and keeps only the first `k`
complete episodes of each cell: the frame names their rows, and only those
lines of the source are parsed again.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import IO, Any

import orjson
import polars as pl

from dphil import __version__
from dphil.io.errors import DataError
from dphil.io.jsonl import open_input
from dphil.io.safe import csp_meta
from dphil.io.safe import for_html as escape
from dphil.results import figure, report

DEFAULT_TIMELINES = 3

Key = tuple[str | None, ...]


def _episode(line: bytes) -> dict[str, Any] | None:
    """A complete episode record, or None for anything else (dphil-stats judged those lines)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("kind", "episode") != "episode" or record.get("status") != "complete":
        return None
    return record


def key_value(value: Any) -> str | None:
    """A grouping value as text, the same for an episode's field and a cell's (3, 3.0, "3")."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class EpisodeSample:
    """The first `k` complete episodes of each cell of `by`, in input order."""

    def __init__(self, by: Sequence[str], k: int) -> None:
        self.by = list(by)
        self.k = k
        self.kept: dict[Key, list[dict[str, Any]]] = {}
        self._seen: dict[Key, int] = {}  # complete episodes per cell in the sources so far

    def __call__(self, source: str, data: bytes | None, frame: pl.DataFrame) -> None:
        """Take this source's share: from `data` when it was read into memory, else the file.

        The frame says which rows are wanted (the first complete ones of each
        cell still short of `k`), so only those lines are parsed. Should a
        wanted line not be the episode its row says (lines the frame does not
        count the same way, such as ones `--on-error skip` left out), the
        source is scanned again by the records' own fields.
        """
        if self.k <= 0 or frame.height == 0:
            return
        done = frame.select(self.by).with_row_index("_row").filter(~frame["_error"])
        for *values, count in done.group_by(self.by).len().iter_rows():
            key = tuple(key_value(v) for v in values)
            self._seen[key] = self._seen.get(key, 0) + count
        firsts = done.group_by(self.by, maintain_order=True).head(self.k).sort("_row")
        wanted: dict[int, Key] = {}
        short: dict[Key, int] = {}
        for row, *values in firsts.select(["_row", *self.by]).iter_rows():
            key = tuple(key_value(v) for v in values)
            room = short.setdefault(key, self.k - len(self.kept.get(key, ())))
            if room > 0:
                wanted[row] = key
                short[key] = room - 1
        if not wanted:
            return
        if not self._take_rows(source, data, wanted):
            self._scan(source, data)

    def _lines(self, source: str, data: bytes | None) -> IO[bytes]:
        return io.BytesIO(data) if data is not None else open_input(source)

    def _take_rows(self, source: str, data: bytes | None, wanted: dict[int, Key]) -> bool:
        """Parse just the wanted rows' lines; False when one is not the episode expected."""
        taken: list[tuple[Key, dict[str, Any]]] = []
        last = max(wanted)
        row = -1
        with self._lines(source, data) as stream:
            for line in stream:
                if line.isspace():
                    continue
                row += 1
                key = wanted.get(row)
                if key is None:
                    continue
                record = _episode(line)
                if record is None or tuple(key_value(record.get(f)) for f in self.by) != key:
                    return False
                taken.append((key, record))
                if row == last:
                    break
        if len(taken) != len(wanted):
            return False
        for key, record in taken:
            self.kept.setdefault(key, []).append(record)
        return True

    def _scan(self, source: str, data: bytes | None) -> None:
        """Read every line of the source, keeping the first `k` complete episodes per cell."""
        due = sum(max(0, min(self.k, seen) - len(self.kept.get(key, ()))) for key, seen in self._seen.items())
        with self._lines(source, data) as stream:
            for line in stream:
                if due <= 0:
                    break
                if line.isspace():
                    continue
                record = _episode(line)
                if record is None:
                    continue
                key = tuple(key_value(record.get(f)) for f in self.by)
                got = self.kept.setdefault(key, [])
                if len(got) < min(self.k, self._seen.get(key, 0)):
                    got.append(record)
                    due -= 1

    def of(self, cell: dict[str, Any]) -> list[dict[str, Any]]:
        return self.kept.get(tuple(key_value(cell.get(f)) for f in self.by), [])


# -- the page -----------------------------------------------------------------------------

STYLE = """
:root { --ink: #1f2328; --muted: #636c76; --line: #d0d7de; --bad: #d62728; --band: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 "DejaVu Sans", Helvetica, Arial, sans-serif; color: var(--ink);
       margin: 0 auto; padding: 16px 24px 48px; max-width: 1280px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 6px; }
p.meta, p.note { color: var(--muted); margin: 4px 0; }
nav a { margin-right: 14px; }
a { color: #0969da; text-decoration: none; }
a:hover { text-decoration: underline; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table { font-size: 13px; }
th, td { padding: 4px 7px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { background: var(--band); text-align: left; font-weight: 600; }
td.num, th.num { text-align: right; }
tr:hover td { background: #fbfcfd; }
figure.plot svg { max-width: 100%; height: auto; }
section.cell { margin-bottom: 8px; }
section.cell:target h3, figure.episode:target figcaption { background: #fff8c5; }
.episodes { display: flex; flex-wrap: wrap; gap: 12px 28px; }
figure.episode { margin: 0; width: min-content; min-width: 340px; }
figure.episode figcaption { font-size: 13px; margin-bottom: 2px; }
figure.episode .id { color: var(--muted); font: 11px monospace; }
figure.episode .outcome.bad { color: var(--bad); }
figure.episode .reward { color: var(--muted); font-size: 12px; }
ul.notes { color: var(--muted); }
"""


def render_page(
    cells: list[dict[str, Any]],
    comps: list[dict[str, Any]],
    by: Sequence[str],
    *,
    sources: Sequence[str],
    sample: EpisodeSample | None,
    compared: bool,
    no_cells: bool = False,
) -> str:
    """The whole report page as text.

    `no_cells` (`--no-cells`): only the comparisons, as in the other formats; the
    header still counts the cells and episodes, but the page has no cell table,
    plot or timelines (and `sample` is not used).
    """
    parts = [
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{csp_meta(style_attributes=True)}"
        f"<title>dphil-stats: {escape(_source_text(sources))}</title>"
        f"<style>{STYLE}</style></head><body>\n",
        _header(cells, by, sources),
    ]
    if no_cells:
        parts += [
            '<p class="note">Only the comparisons (<code>--no-cells</code>): no cell table, '
            "plots or episode timelines.</p>\n",
            '<h2 id="comparisons">Comparisons</h2>\n',
            _comparisons(comps, by, compared),
        ]
    else:
        labels = [_cell_label(c, by) for c in cells]
        parts += [
            '<nav><a href="#results">Results</a><a href="#comparisons">Comparisons</a>'
            '<a href="#plots">Plots</a><a href="#timelines">Episode timelines</a></nav>\n',
            '<h2 id="results">Results</h2>\n',
            _cell_table(cells, by, sample),
            '<h2 id="comparisons">Comparisons</h2>\n',
            _comparisons(comps, by, compared),
            '<h2 id="plots">Plots</h2>\n',
            _plots(cells, by),
            '<h2 id="timelines">Episode timelines</h2>\n',
            _timelines(cells, labels, sample),
        ]
    parts.append(
        f'<p class="meta">Made by dphil {escape(__version__)} '
        "(<code>dphil-stats --format html</code>).</p>\n</body></html>\n"
    )
    return "".join(parts)


def _source_text(sources: Sequence[str]) -> str:
    names = ["<stdin>" if s == "-" else s for s in (list(sources) or ["-"])]
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} and {len(names) - 1} more files"


def _header(cells: list[dict[str, Any]], by: Sequence[str], sources: Sequence[str]) -> str:
    episodes = sum(c["episodes"] for c in cells)
    errors = sum(c["errors"] for c in cells)
    variants = sorted({str(c["reward_variant"]) for c in cells if c.get("reward_variant")})
    facts = [
        f"{len(cells)} cells by {escape(', '.join(by))}",
        f"{episodes} episodes" + (f" (and {errors} errored, left out)" if errors else ""),
        "reward: " + (escape(", ".join(variants)) or "n/a"),
    ]
    return (
        f'<h1>dphil-stats report</h1>\n<p class="meta">{escape(_source_text(sources))}</p>\n'
        f'<p class="meta">{" · ".join(facts)}. Intervals are 95%: t for the mean reward, '
        "Wilson for the deadlock rate.</p>\n"
    )


def _table(header: list[str], rows: list[list[str]], extra: list[str] | None = None, extra_header: str = "") -> str:
    numeric = [report.numeric_column(rows, k) for k in range(len(header))]
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f"<th{' class=num' if n else ''}>{escape(h)}</th>" for h, n in zip(header, numeric, strict=True)]
    if extra is not None:
        out.append(f"<th>{escape(extra_header)}</th>")
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        out.append("<tr>")
        out += [f"<td{' class=num' if n else ''}>{escape(v)}</td>" for v, n in zip(row, numeric, strict=True)]
        if extra is not None:
            out.append(f"<td>{extra[i]}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>\n")
    return "".join(out)


def _cell_table(cells: list[dict[str, Any]], by: Sequence[str], sample: EpisodeSample | None) -> str:
    header, rows = report.cell_rows(cells, by)
    links = []
    for i, c in enumerate(cells):
        shown = len(sample.of(c)) if sample is not None else 0
        links.append(f'<a href="#cell-{i}">{shown} shown</a>' if shown else "none")
    return _table(header, rows, links, "timelines")


def _comparisons(comps: list[dict[str, Any]], by: Sequence[str], compared: bool) -> str:
    if not comps:
        return (
            '<p class="note">No comparison: none of the --compare arms was found.</p>\n'
            if compared
            else '<p class="note">No comparisons asked for: add <code>--compare FIELD A B</code> '
            "(differences are B − A).</p>\n"
        )
    out = [_table(*report.comparison_rows(comps, by))]
    notes = [(c, n) for c in comps for n in c["notes"]]
    if notes:
        out.append('<ul class="notes">')
        out += [f"<li>{escape(report.note_label(c, by))}: {escape(n)}</li>" for c, n in notes]
        out.append("</ul>\n")
    return "".join(out)


def _plots(cells: list[dict[str, Any]], by: Sequence[str]) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "<p class=\"note\">The plots need matplotlib: <code>pip install 'dphil[plot]'</code>.</p>\n"
    if not any(c["episodes"] for c in cells):
        return '<p class="note">No complete episodes to plot.</p>\n'
    return f'<figure class="plot" id="plot">{figure.plot_svg(cells, by)}</figure>\n'


def _timelines(cells: list[dict[str, Any]], labels: list[str], sample: EpisodeSample | None) -> str:
    from dphil.show.svg import episode_svg
    from dphil.show.timeline import describe, outcome_text, reward_text, timeline
    from dphil.show.viewer import legend_html

    if sample is None or sample.k <= 0:
        return (
            '<p class="note">No timelines (<code>--timelines 0</code>); give '
            "<code>--timelines K</code> to draw the first K episodes of each cell.</p>\n"
        )
    out = [
        f'<p class="note">The first {sample.k} complete episodes of each cell, in input '
        "order (<code>--timelines K</code> sets how many; the page keeps no more than "
        "that, however large the input). One row per philosopher, one column per round; "
        "hover a cell for its turn.</p>\n",
        legend_html(),
        "\n",
    ]
    for i, (cell, label) in enumerate(zip(cells, labels, strict=True)):
        episodes = sample.of(cell)
        out.append(
            f'<section class="cell" id="cell-{i}"><h3>{escape(label)}</h3>'
            f'<p class="note">{len(episodes)} of {cell["episodes"]} complete episodes '
            "shown"
        )
        if episodes:
            out.append(
                ": "
                + ", ".join(
                    f'<a href="#cell-{i}-ep-{j}">seed {escape(str(e.get("seed")))}</a>' for j, e in enumerate(episodes)
                )
            )
        out.append('.</p><div class="episodes">')
        for j, record in enumerate(episodes):
            ident = escape(str(record.get("episode_id", "")))
            out.append(f'<figure class="episode" id="cell-{i}-ep-{j}" data-episode="{ident}">')
            try:
                tl = timeline(record)
                svg = episode_svg(record, tl=tl, standalone=False)
            except DataError as e:
                out.append(
                    f"<figcaption>{escape(describe(record))}</figcaption>"
                    f'<p class="note">Cannot draw this episode: {escape(e.reason)}</p>'
                    "</figure>"
                )
                continue
            bad = " bad" if tl.deadlock_rounds else ""
            reward = reward_text(record)
            out.append(
                f'<figcaption title="{escape(describe(record))}">'
                f"<b>seed {escape(str(record.get('seed')))}</b> "
                f'<span class="id">{ident}</span><br>'
                f'<span class="outcome{bad}">{escape(outcome_text(tl))}</span>'
                + (f'<br><span class="reward">{escape(reward)}</span>' if reward else "")
                + f"</figcaption>{svg}</figure>"
            )
        out.append("</div></section>\n")
    return "".join(out)


def _cell_label(cell: dict[str, Any], by: Sequence[str]) -> str:
    return ", ".join(f"{f} = {report.value_text(cell.get(f))}" for f in by)
