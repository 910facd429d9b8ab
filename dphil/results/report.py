"""Cell and comparison records as a reader sees them: markdown, CSV, a terminal table.

JSONL stays the data; these renderings are for a results section (markdown a reader can
paste, with the 95% intervals next to every estimate) and a spreadsheet (CSV, flattened,
unrounded). The plot, for people who would rather look than read, is `dphil.results.figure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dphil.io.safe import for_terminal

FORMATS = ("jsonl", "markdown", "csv", "table")
_NA = "n/a"


# -- numbers as text ----------------------------------------------------------------------


def num(x: float | int | None, digits: int = 3) -> str:
    if x is None:
        return _NA
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return f"{x:.{digits}f}"


def pct(x: float | None) -> str:
    return _NA if x is None else f"{100 * x:.1f}%"


def p_text(p: float | None) -> str:
    if p is None:
        return _NA
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def with_ci(x: float | None, ci: Sequence[float] | None, digits: int = 3) -> str:
    if x is None:
        return _NA
    if not ci:
        return num(x, digits)
    return f"{num(x, digits)} [{num(ci[0], digits)}, {num(ci[1], digits)}]"


def pct_ci(x: float | None, ci: Sequence[float] | None) -> str:
    if x is None:
        return _NA
    if not ci:
        return pct(x)
    return f"{pct(x)} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _signed(x: float | None, ci: Sequence[float] | None, digits: int = 3) -> str:
    if x is None:
        return _NA
    text = f"{x:+.{digits}f}"
    if ci:
        text += f" [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"
    return text


# -- rows ---------------------------------------------------------------------------------


def cell_rows(
    cells: list[dict[str, Any]], by: Sequence[str], reward: str | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-cell table (`reward`: the variant, named in the header)."""
    tokens = any(c["prompt_tokens"] or c["completion_tokens"] or c["cost"] for c in cells)
    talk = any(c.get("message_consistency_episodes") for c in cells)  # only runs with --talk have it
    header = [
        *by,
        "episodes",
        "errors",
        f"reward{_variant(reward)} (95% CI)",
        "deadlock (95% CI)",
        "meals",
        "degenerate",
        "null actions",
        "failed actions",
    ]
    if talk:
        header += ["consistency (episodes)"]
    if tokens:
        header += ["tokens in", "tokens out", "cost"]
    rows = []
    for c in cells:
        row = [value_text(c.get(f)) for f in by] + [
            str(c["episodes"]),
            str(c["errors"]),
            with_ci(c["reward_mean"], c["reward_ci"]),
            pct_ci(c["deadlock_rate"], c["deadlock_ci"]),
            num(c["meals_mean"], 2),
            pct(c["degenerate_rate"]),
            pct(c["null_action_rate"]),
            pct(c["failed_action_rate"]),
        ]
        if talk:
            k = c.get("message_consistency_episodes")
            row += [f"{num(c.get('message_consistency_mean'))} ({k})" if k else _NA]
        if tokens:
            row += [str(c["prompt_tokens"]), str(c["completion_tokens"]), f"{c['cost']:.4f}"]
        rows.append(row)
    return header, rows


def comparison_rows(
    comps: list[dict[str, Any]], by: Sequence[str], reward: str | None = None
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table (B − A)."""
    group = [f for f in by if any(f in c for c in comps)]
    paired = any(c["paired"] for c in comps)
    power = any("power" in c for c in comps)
    clustered = next((c["clustered"]["field"] for c in comps if c.get("clustered")), None)
    adjust = comps[0]["adjust"] if comps else "none"
    header = [*group, "comparison (B − A)", "episodes A/B", f"Δ reward{_variant(reward)} (95% CI)", "Welch t (df)", "p"]
    if adjust != "none":
        header.append(f"p ({adjust})")
    header += ["Hedges' g (95% CI)", "Δ deadlock (95% CI)", "p deadlock"]
    if paired:
        header += ["pairs", "paired t p", "Wilcoxon p", "McNemar p"]
    if clustered:
        over = f" over units ({adjust})" if adjust != "none" else " over units"
        header += [f"units A/B ({clustered})", f"p{over}", f"p deadlock{over}"]
    if power:
        header += ["g for power", "episodes/arm for 80%", "detectable g now"]
    rows = []
    for c in comps:
        dl = c["deadlock"]
        t = _NA if c["welch_t"] is None else f"{c['welch_t']:.2f} ({c['df']:.1f})"
        row = [value_text(c[f]) if f in c else "" for f in group] + [
            f"{c['field']}: {value_text(c['a']['value'])} → {value_text(c['b']['value'])}",
            f"{c['a']['episodes']}/{c['b']['episodes']}",
            _signed(c["diff"], c["diff_ci"]),
            t,
            p_text(c["p_value"]),
        ]
        if adjust != "none":
            row.append(p_text(c["p_adjusted"]))
        dl_test = f" ({dl['test']})" if dl["test"] else ""
        row += [
            _signed(c["hedges_g"], c["hedges_g_ci"], 2),
            _signed(dl["diff"], dl["diff_ci"]),
            p_text(dl["p_value"]) + dl_test,
        ]
        if paired:
            pt = c["paired_tests"]
            if pt is None:
                row += [_NA] * 4
            else:
                row += [
                    str(pt["pairs"]),
                    p_text(pt["p_value"]),
                    p_text(pt["wilcoxon_p"]),
                    p_text(pt["mcnemar"]["p_value"]),
                ]
        if clustered:
            cl = c.get("clustered") or {}
            units = "/".join(_NA if cl.get(k) is None else str(cl[k]) for k in ("a_units", "b_units"))
            p = "p_adjusted" if adjust != "none" else "p_value"
            row += [units, p_text(cl.get(p)), p_text((cl.get("deadlock") or {}).get(p))]
        if power:
            pw = c.get("power") or {}
            needed = pw.get("episodes_per_arm")
            row += [num(pw.get("effect_g"), 2), _NA if needed is None else str(needed), num(pw.get("detectable_g"), 2)]
        rows.append(row)
    return header, rows


def value_text(v: Any) -> str:
    """A record value as a table shows it: grouping values come from records (model names, tags),
    so control characters are shown, never passed to the terminal."""
    if v is None:
        return _NA
    if isinstance(v, bool):
        return "true" if v else "false"
    return for_terminal(v)


# -- renderers ----------------------------------------------------------------------------


def markdown(header: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    numeric = [numeric_column(rows, k) for k in range(len(header))]
    lines = [
        "| " + " | ".join(esc(h) for h in header) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _variant(reward: str | None) -> str:
    return f" {reward}" if reward else ""


def table(header: list[str], rows: list[list[str]], *, width: int | None = None, keys: int = 0) -> str:
    """A plain-text table; wider than `width`, it wraps into blocks of columns, each repeating the
    first `keys` columns (the cell's fields), the way wide frames print in a terminal."""
    if width is not None and rows and len(header) > keys:
        blocks = _blocks(header, rows, width, keys)
        if len(blocks) > 1:
            return "\n".join(table([header[k] for k in cols], [[r[k] for k in cols] for r in rows]) for cols in blocks)
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h) for k, h in enumerate(header)]
    numeric = [numeric_column(rows, k) for k in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    return "\n".join(out) + "\n"


def _blocks(header: list[str], rows: list[list[str]], width: int, keys: int) -> list[list[int]]:
    """Column indices per block: the key columns, then as many others as fit in `width`."""
    wide = [max(len(h), *(len(r[k]) for r in rows)) + 2 for k, h in enumerate(header)]
    base = sum(wide[:keys])
    blocks: list[list[int]] = []
    current: list[int] = []
    used = base
    for k in range(keys, len(header)):
        if current and used + wide[k] > width + 2:
            blocks.append(list(range(keys)) + current)
            current, used = [], base
        current.append(k)
        used += wide[k]
    blocks.append(list(range(keys)) + current)
    return blocks


def numeric_column(rows: list[list[str]], k: int) -> bool:
    values = [r[k] for r in rows if r[k] != _NA]
    return bool(values) and all(v[:1].isdigit() or v[:1] in "+-<" for v in values)


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects become `a_b` columns, intervals `x_lo`/`x_hi`, notes one text cell."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "_"))
        elif key.endswith("_ci"):
            lo, hi = value if value else (None, None)
            out[name + "_lo"], out[name + "_hi"] = lo, hi
        elif isinstance(value, list):
            out[name] = "; ".join(str(v) for v in value)
        else:
            out[name] = value
    return out


def csv_text(records: list[dict[str, Any]]) -> str:
    """Flattened records as CSV (columns in first-seen order; blanks for missing)."""
    import csv
    import io

    flat = [flatten(r) for r in records]
    columns: dict[str, None] = {}
    for f in flat:
        columns.update(dict.fromkeys(f))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for f in flat:
        writer.writerow({k: ("" if v is None else v) for k, v in f.items()})
    return buf.getvalue()


def render(
    fmt: str,
    cells: list[dict[str, Any]],
    comps: list[dict[str, Any]],
    by: Sequence[str],
    *,
    reward: str | None = None,
    width: int | None = None,
) -> str:
    """The whole report in a text format: the cell table, then the comparison table.

    `reward` names the reward variant in the headers; `width` wraps the terminal table into
    column blocks (None: one wide table). CSV puts the two tables one after the other,
    separated by a blank line (with `--no-cells` it is a single table, ready for any CSV reader).
    """
    if fmt == "csv":
        parts = [csv_text(x) for x in (cells, comps) if x]
        return "\n".join(parts)
    parts = []
    if cells:
        header, rows = cell_rows(cells, by, reward)
        parts.append(markdown(header, rows) if fmt == "markdown" else table(header, rows, width=width, keys=len(by)))
    if comps:
        header, rows = comparison_rows(comps, by, reward)
        keys = header.index("comparison (B − A)") + 1
        parts.append(markdown(header, rows) if fmt == "markdown" else table(header, rows, width=width, keys=keys))
        notes = [(c, n) for c in comps for n in c["notes"]]
        if notes:
            lines = [f"- {note_label(c, by)}: {n}" for c, n in notes]
            parts.append(
                "Notes:\n\n" + "\n".join(lines) + "\n" if fmt == "markdown" else "notes:\n" + "\n".join(lines) + "\n"
            )
    return "\n".join(parts)


def note_label(c: dict[str, Any], by: Sequence[str]) -> str:
    group = " ".join(f"{f}={value_text(c[f])}" for f in by if f in c and f != c["field"])
    what = f"{c['field']} {value_text(c['a']['value'])} vs {value_text(c['b']['value'])}"
    return f"{what} {group}".strip()
