"""An episode's timeline as SVG: a picture that stands alone or sits inline in an HTML page.

The grid is `dphil.show.timeline`'s; each philosopher and round played is one element of
class `mark` with data attributes and a tooltip, which the viewer (`dphil.show.viewer`)
and the HTML report (`dphil.results.html_report`) script and link to.
"""

from __future__ import annotations

from typing import Any

from dphil.io.safe import for_xml as escape
from dphil.show.timeline import (
    BOTH,
    EATING,
    LEFT,
    RIGHT,
    THINKING,
    Timeline,
    describe,
    outcome_text,
    reward_text,
    timeline,
    turn_text,
)

CELL_W, CELL_H = 28, 22  # a cell: a plate with room for a fork bar on each side
PITCH_X, PITCH_Y = 32, 26
CELL = CELL_H
_UNPLAYED_COLUMNS = 20  # at most this many empty columns after the last round played
_PLATE, _PLATE_EDGE, _FORK, _EAT, _BOTH = "#f1f3f5", "#c9ced6", "#3b6ea5", "#4a9b45", "#d7e5f4"
_FAIL, _NULL, _DEADLOCK, _INK, _MUTED = "#d62728", "#e07b00", "#d62728", "#1f2328", "#636c76"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


def _cell_shapes(x: int, y: int, state: str, *, failed: bool = False, null: bool = False, missing: bool = False) -> str:
    """The drawing of one cell: a plate, with a fork bar on each side held, green when eating."""
    fill = _EAT if state == EATING else _BOTH if state == BOTH else _PLATE
    edge, width, dash = (
        (_FAIL, 2.2, "")
        if failed
        else (_NULL, 2.2, ' stroke-dasharray="3 2"')
        if null
        else (_PLATE_EDGE, 1, ' stroke-dasharray="2 2"' if missing else "")
    )
    out = [
        f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" rx="4" fill="{fill}" stroke="{edge}" '
        f'stroke-width="{width}"{dash}/>'
    ]
    fork = "#ffffff" if state == EATING else _FORK
    if state in (LEFT, BOTH, EATING):
        out.append(f'<rect x="{x + 3}" y="{y + 4}" width="5" height="{CELL_H - 8}" rx="1.5" fill="{fork}"/>')
    if state in (RIGHT, BOTH, EATING):
        out.append(f'<rect x="{x + CELL_W - 8}" y="{y + 4}" width="5" height="{CELL_H - 8}" rx="1.5" fill="{fork}"/>')
    if null:
        out.append(
            f'<text x="{x + CELL_W / 2}" y="{y + CELL_H / 2 + 4}" text-anchor="middle" font-size="11" '
            f'font-weight="bold" fill="{_NULL}">?</text>'
        )
    elif failed:
        c = x + CELL_W / 2
        m = y + CELL_H / 2
        out.append(
            f'<path d="M{c - 3} {m - 3}L{c + 3} {m + 3}M{c + 3} {m - 3}L{c - 3} {m + 3}" '
            f'stroke="{_FAIL}" stroke-width="2" stroke-linecap="round"/>'
        )
    return "".join(out)


def episode_svg(record: dict[str, Any], *, tl: Timeline | None = None, standalone: bool = True) -> str:
    """The episode as an SVG document (no XML declaration, so it can also sit inline in HTML).

    Every philosopher × round played is one `<g class="mark">` with `data-p`
    (philosopher), `data-r` (round), `data-state`, `data-t` (index into the
    record's turns, absent when no turn was recorded) and a `<title>` tooltip.
    `standalone=False` leaves out the heading, reward line and legend, for a
    page that shows them itself.
    """
    tl = tl or timeline(record)
    n, rounds, played = tl.n, tl.rounds, tl.rounds_played
    reward = reward_text(record) if standalone else None
    left, top = 66, (62 if standalone else 18)  # room for the "deadlock" label, so grids line up
    cols = min(rounds, played + _UNPLAYED_COLUMNS)  # a record may claim any number of rounds
    grid_w = max(cols, 1) * PITCH_X
    grid_bottom = top + n * PITCH_Y
    width = left + grid_w + 70
    if standalone:
        width = max(width, 8 + 7 * len(reward or ""), 8 + 8 * len(describe(record)), 560)
    below = grid_bottom + (14 if tl.deadlock_rounds else 0)
    height = below + (24 if reward else 0) + (36 if standalone else 4)
    ident = escape(str(record.get("episode_id", "")))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dphil-timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{FONT}" font-size="12" fill="{_INK}" '
        f'data-episode="{ident}" data-n="{n}" data-rounds="{played}">',
        f"<title>{escape(describe(record))} · {escape(outcome_text(tl))}</title>",
    ]
    if standalone:
        parts += [
            f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text x="8" y="20" font-size="14" font-weight="bold">{escape(describe(record))}</text>',
            f'<text x="8" y="38" fill="{_DEADLOCK if tl.deadlock_rounds else _MUTED}">'
            f"{escape(outcome_text(tl))}</text>",
        ]
    for r in tl.deadlock_rounds:
        x: float = left + (r - 1) * PITCH_X - 3
        parts.append(
            f'<rect class="deadlock" data-r="{r}" x="{x}" y="{top - 16}" width="{CELL_W + 6}" '
            f'height="{n * PITCH_Y + 14}" rx="5" fill="{_DEADLOCK}" fill-opacity="0.13"/>'
        )
        parts.append(f'<rect x="{x + 3}" y="{grid_bottom + 1}" width="{CELL_W}" height="4" rx="2" fill="{_DEADLOCK}"/>')
    if tl.deadlock_rounds:
        parts.append(
            f'<text x="{left - 8}" y="{grid_bottom + 7}" text-anchor="end" font-size="10" '
            f'font-weight="bold" fill="{_DEADLOCK}">deadlock</text>'
        )
    for r in range(1, cols + 1):
        x = left + (r - 1) * PITCH_X + CELL_W / 2
        label = r if r < cols or cols == rounds else f"…{rounds}"
        parts.append(
            f'<text x="{x}" y="{top - 5}" text-anchor="middle" font-size="10" '
            f'fill="{_MUTED if r > played else _INK}">{label}</text>'
        )
    if played < cols:
        x = left + played * PITCH_X
        w = (cols - played) * PITCH_X - 4
        parts.append(
            f'<rect class="unplayed" x="{x}" y="{top}" width="{w}" height="{n * PITCH_Y - 4}" rx="4" '
            f'fill="#fafbfc" stroke="{_PLATE_EDGE}" stroke-dasharray="4 3"/>'
        )
        if w >= 60:
            parts.append(
                f'<text x="{x + w / 2}" y="{top + n * PITCH_Y / 2}" text-anchor="middle" font-size="10" '
                f'fill="{_MUTED}">not played</text>'
            )
    for i, row in enumerate(tl.cells):
        y = top + i * PITCH_Y
        parts.append(f'<text x="{left - 8}" y="{y + CELL_H / 2 + 4}" text-anchor="end">P{i}</text>')
        for r, cell in enumerate(row, 1):
            x = left + (r - 1) * PITCH_X
            flags = " failed" if cell.failed else " null" if cell.null else " missing" if cell.missing else ""
            t = "" if cell.index is None else f' data-t="{cell.index}"'
            parts.append(
                f'<g class="mark {cell.state}{flags}" data-p="{i}" data-r="{r}" data-state="{cell.state}"'
                f"{t}><title>{escape(turn_text(cell, i, r))}</title>"
                f"{_cell_shapes(x, y, cell.state, failed=cell.failed, null=cell.null, missing=cell.missing)}"
                "</g>"
            )
        meals = tl.meals[i] if i < len(tl.meals) else 0
        style = f'fill="{_INK}" font-weight="bold"' if meals else f'fill="{_MUTED}"'
        parts.append(
            f'<text x="{left + grid_w + 4}" y="{y + CELL_H / 2 + 4}" {style}>'
            f"{meals} meal{'' if meals == 1 else 's'}</text>"
        )
    y = below
    if reward:
        parts.append(f'<text class="reward" x="8" y="{y + 17}">{escape(reward)}</text>')
        y += 24
    if standalone:
        parts.append(legend_svg(8, y + 8))
    parts.append("</svg>")
    return "".join(parts)


def legend_svg(x: int, y: int) -> str:
    """A row of small example cells with their meaning."""
    items = [
        (THINKING, {}, "no fork"),
        (LEFT, {}, "left fork"),
        (RIGHT, {}, "right fork"),
        (BOTH, {}, "both forks"),
        (EATING, {}, "eating"),
        (THINKING, {"failed": True}, "failed"),
        (THINKING, {"null": True}, "no action"),
    ]
    out = [f'<g class="legend" transform="translate({x} {y}) scale(0.8)">']
    cx = 0
    for state, flags, label in items:
        out.append(_cell_shapes(cx, 0, state, **flags))
        out.append(f'<text x="{cx + CELL_W + 5}" y="{CELL_H / 2 + 5}" font-size="13" fill="{_MUTED}">{label}</text>')
        cx += CELL_W + 22 + 7 * len(label)
    out.append("</g>")
    return "".join(out)
