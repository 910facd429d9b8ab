"""The one-screen summary a scored run ends with: per model and table size, what happened.

Researchers used to inspect_ai and lm-evaluation-harness expect a results table when a run
ends, not a silent prompt. `dphil-score` feeds every record it writes through a `Summary`
(a few counters per cell: no episode is kept) and prints the table to a terminal's stderr;
stdout stays records only. The full statistics, with intervals and tests, are `dphil-stats`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dphil.io.safe import for_terminal

WIDTH = 100  # the table fits a 100-column terminal


@dataclass
class _Cell:
    episodes: int = 0
    errors: int = 0
    turns: int = 0
    acted: int = 0  # turns with a parsed action (not null)
    meals: int = 0
    deadlocks: int = 0
    scored: int = 0
    reward: float = 0.0


class Summary:
    """Counters per (model, N) over a stream of scored episode records."""

    def __init__(self) -> None:
        self.cells: dict[tuple[str, int], _Cell] = {}
        self.variants: set[str] = set()

    def add(self, record: dict[str, Any]) -> None:
        n = record.get("n")
        key = (for_terminal(record.get("model", "?")), n if isinstance(n, int) else 0)
        cell = self.cells.setdefault(key, _Cell())
        cell.episodes += 1
        if record.get("status") == "error":
            cell.errors += 1
            return
        turns = record.get("turns") or []
        cell.turns += len(turns)
        cell.acted += sum(1 for t in turns if isinstance(t, dict) and t.get("action") is not None)
        meals = record.get("meals") or []
        cell.meals += sum(m for m in meals if isinstance(m, int))
        cell.deadlocks += bool(record.get("deadlock"))
        reward = record.get("reward")
        if isinstance(reward, dict) and isinstance(reward.get("total"), int | float):
            cell.scored += 1
            cell.reward += float(reward["total"])
            self.variants.add(for_terminal(reward.get("variant", "?")))

    def render(self, width: int = WIDTH) -> str:
        """The table as text lines, at most `width` columns (long model names are cut with '…')."""
        if not self.cells:
            return ""
        reward = "/".join(sorted(self.variants)) or "none"
        head = ("N", "episodes", "errors", "parsed", "meals/ep", "deadlock", f"reward ({reward})")
        rows = []
        for (model, n), c in sorted(self.cells.items()):
            done = c.episodes - c.errors
            rows.append(
                (
                    model,
                    str(n),
                    str(c.episodes),
                    str(c.errors),
                    _pct(c.acted, c.turns),
                    f"{c.meals / done:.2f}" if done else "-",
                    _pct(c.deadlocks, done),
                    f"{c.reward / c.scored:+.3f}" if c.scored else "-",
                )
            )
        widths = [max(len(h), *(len(r[k + 1]) for r in rows)) for k, h in enumerate(head)]
        rest = sum(widths) + 2 * len(widths)
        model_width = max(5, min(max(len(r[0]) for r in rows), width - rest))
        lines = [
            "  ".join(["model".ljust(model_width), *(h.rjust(w) for h, w in zip(head, widths, strict=True))]).rstrip()
        ]
        for r in rows:
            name = r[0] if len(r[0]) <= model_width else r[0][: model_width - 1] + "…"
            cells = (v.rjust(w) for v, w in zip(r[1:], widths, strict=True))
            lines.append("  ".join([name.ljust(model_width), *cells]).rstrip())
        return "\n".join(lines)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"
