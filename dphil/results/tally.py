"""What dphil-stats keeps while it reads: running totals per cell, the compared arms, the ids seen.

dphil-stats keeps no episode. Each chunk of a source (`dphil.results.frame`) is folded into

* `Totals`: per value of the fields read, the counts and sums a cell record is made of, with
  the reward's mean and sum of squared deviations merged chunk by chunk (Chan's formula): a
  few hundred bytes a cell, however many episodes it holds;
* `Arms`: for each `--compare`, the status, seed, reward and deadlock of the episodes of its two
  arms, which Welch's t, Hedges' g and the paired tests take one by one (about 30 bytes an
  episode of the arms; cells × seeds when the arms share their seeds, as grids do);
* `SeenIds`: every `episode_id` read and where, to refuse or drop a repeat: 16 bytes an id for
  the 16-hex-digit ids dphil writes (a million ids are 16 MB), a dict entry for any other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

Key = tuple[Any, ...]

# Summed as they come; the rest of a cell record is made of these and of the reward's moments.
_SUMS: tuple[tuple[str, pl.Expr], ...] = (
    ("errors", pl.col("_error").sum()),
    ("deadlocks", pl.col("_deadlock").sum()),
    ("meals", pl.col("_meals").sum()),
    ("zero_meals", (pl.col("_meals") == 0).sum()),
    ("degenerate", ((pl.col("_meals") == 0) & ~pl.col("_deadlock")).sum()),
    ("throughput", pl.col("_throughput").sum()),
    ("gini", pl.col("_gini").sum()),
    ("starvation", pl.col("_starvation").sum()),
    ("ttd", pl.col("_ttd").sum()),
    ("ttd_n", pl.col("_ttd").count()),
    ("consistency", pl.col("_consistency").sum()),
    ("consistency_n", pl.col("_consistency").count()),  # episodes that stated an intention
    ("turns", pl.col("_turns").sum()),
    ("null", pl.col("_null").sum()),
    ("acted", pl.col("_acted").sum()),
    ("failed", pl.col("_failed").sum()),
    ("prompt_tokens", pl.col("_prompt_tokens").sum()),
    ("completion_tokens", pl.col("_completion_tokens").sum()),
    ("cost", pl.col("_cost").sum()),
)


@dataclass(slots=True)
class Total:
    """One cell's running totals: complete episodes, their reward's mean and M2, the sums."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    variants: set[str] = field(default_factory=set)
    sums: list[Any] = field(default_factory=lambda: [0] * len(_SUMS))

    def merge(self, n: int, mean: float | None, m2: float | None, variants: Sequence[str], sums: Sequence[Any]) -> None:
        if n and mean is not None:
            if self.n == 0:
                self.mean, self.m2 = mean, m2 or 0.0
            else:  # Chan et al.: equal means add nothing, so a constant reward keeps a zero variance
                total = self.n + n
                delta = mean - self.mean
                self.mean += delta * n / total
                self.m2 += (m2 or 0.0) + delta * delta * self.n * n / total
            self.n += n
        self.variants.update(variants)
        self.sums = [a + (b or 0) for a, b in zip(self.sums, sums, strict=True)]

    def add(self, other: Total) -> None:
        self.merge(other.n, other.mean, other.m2, sorted(other.variants), other.sums)


class Totals:
    """Running cell totals per value of `keys`, fed one chunk of derived episode rows at a time."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = list(keys)
        self.cells: dict[Key, Total] = {}

    def add(self, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        reward = pl.col("_reward")
        part = frame.group_by(self.keys).agg(
            reward.count().alias("_n"),
            reward.mean().alias("_mean"),
            (reward.var(ddof=0) * reward.count()).alias("_m2"),
            pl.col("_variant").drop_nulls().unique().alias("_variants"),
            *(expr.alias(name) for name, expr in _SUMS),
        )
        k = len(self.keys)
        for row in part.iter_rows():
            total = self.cells.get(row[:k])
            if total is None:
                total = self.cells[row[:k]] = Total()
            total.merge(row[k], row[k + 1], row[k + 2], row[k + 3], row[k + 4 :])

    def regrouped(self, keys: Sequence[str], convert: Callable[[list[Key]], list[Key]] | None = None) -> Totals:
        """The same totals per value of `keys` (a subset of these keys), after `convert`ing the keys."""
        out = Totals(keys)
        old = list(self.cells)
        new = convert(old) if convert is not None else old
        where = [self.keys.index(k) for k in keys]
        for key, typed in zip(old, new, strict=True):
            target = tuple(typed[i] for i in where)
            total = out.cells.get(target)
            if total is None:
                total = out.cells[target] = Total()
            total.add(self.cells[key])
        return out

    def summary(self, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """One row per cell: its keys (typed by `schema`) and the columns `cells.cell_records` reads."""
        rows: list[dict[str, Any]] = []
        names = [name for name, _ in _SUMS]
        for key, t in self.cells.items():
            s = dict(zip(names, t.sums, strict=True))
            n = t.n
            rows.append(
                {
                    **dict(zip(self.keys, key, strict=True)),
                    "episodes": n,
                    "errors": s["errors"],
                    "variants": sorted(t.variants),
                    "reward_mean": t.mean if n else None,
                    "reward_std": (t.m2 / (n - 1)) ** 0.5 if n > 1 else None,
                    "deadlocks": s["deadlocks"],
                    "meals_mean": s["meals"] / n if n else None,
                    "zero_meals": s["zero_meals"],
                    "degenerate": s["degenerate"],
                    "throughput_mean": s["throughput"] / n if n else None,
                    "gini_fairness_mean": s["gini"] / n if n else None,
                    "starvation_mean": s["starvation"] / n if n else None,
                    "time_to_deadlock_mean": s["ttd"] / s["ttd_n"] if s["ttd_n"] else None,
                    # Over the episodes that have it: a null (no --talk, no intention stated) is no 0.
                    "message_consistency_mean": s["consistency"] / s["consistency_n"] if s["consistency_n"] else None,
                    "message_consistency_episodes": s["consistency_n"],
                    **{name: s[name] for name in _SUMMED_OUT},
                }
            )
        columns: dict[str, pl.DataType] = {k: schema[k] for k in self.keys} | _SUMMARY
        return pl.DataFrame(rows, schema=columns)


_SUMMED_OUT = ("turns", "null", "acted", "failed", "prompt_tokens", "completion_tokens", "cost")
_SUMMARY: dict[str, pl.DataType] = {
    "episodes": pl.Int64(),
    "errors": pl.Int64(),
    "variants": pl.List(pl.String()),
    "reward_mean": pl.Float64(),
    "reward_std": pl.Float64(),
    "deadlocks": pl.Int64(),
    "meals_mean": pl.Float64(),
    "zero_meals": pl.Int64(),
    "degenerate": pl.Int64(),
    "throughput_mean": pl.Float64(),
    "gini_fairness_mean": pl.Float64(),
    "starvation_mean": pl.Float64(),
    "time_to_deadlock_mean": pl.Float64(),
    "message_consistency_mean": pl.Float64(),
    "message_consistency_episodes": pl.Int64(),
    "turns": pl.Int64(),
    "null": pl.Int64(),
    "acted": pl.Int64(),
    "failed": pl.Int64(),
    "prompt_tokens": pl.Int64(),
    "completion_tokens": pl.Int64(),
    "cost": pl.Float64(),
}

# What a comparison needs of each episode of its arms.
ARM_COLUMNS = ("_error", "_seed", "_reward", "_deadlock")


class Arms:
    """The episodes that may belong to one comparison's arms, per value of the fields read.

    Which values are A and B is settled only once every source is read (a free field's type is
    known then), so a chunk keeps each row whose value reads as A or B under any of the types
    it may get: as text, as an integer, as a number.
    """

    def __init__(self, column: str, wanted: Sequence[str], keys: Sequence[str], typed: bool) -> None:
        self.column = column
        self.wanted = list(wanted)
        self.keys = list(keys)
        self.typed = typed  # a contract field: its type is known already
        self.pieces: dict[Key, list[pl.DataFrame]] = {}

    def add(self, frame: pl.DataFrame) -> None:
        col = pl.col(self.column)
        forms = [col.cast(pl.String)]
        if not self.typed:
            forms += [
                col.cast(pl.Int64, strict=False).cast(pl.String),
                col.cast(pl.Float64, strict=False).cast(pl.String),
            ]
        mine = frame.filter(pl.any_horizontal(f.is_in(self.wanted) for f in forms).fill_null(False))
        if mine.height == 0:
            return
        parts = mine.select(*self.keys, *ARM_COLUMNS).partition_by(self.keys, as_dict=True, include_key=False)
        for key, piece in parts.items():
            kept = self.pieces.setdefault(key, [])
            kept.append(piece)
            # Joined as they grow (each piece at least twice the next): log2(rows) pieces a key,
            # each row copied log2(rows) times at most.
            while len(kept) > 1 and kept[-1].height * 2 >= kept[-2].height:
                last = kept.pop()
                kept[-1] = pl.concat([kept[-1], last], rechunk=True)

    def joined(self) -> dict[Key, pl.DataFrame]:
        return {
            key: pl.concat(parts, rechunk=True) if len(parts) > 1 else parts[0] for key, parts in self.pieces.items()
        }


# -- the ids seen -------------------------------------------------------------------------

_LINE_BITS = 40  # a location is source << 40 | line: 2**40 lines a source, 2**24 sources
_HEX_ID = r"^[0-9a-f]{16}$"


@dataclass(frozen=True)
class Repeat:
    """A row whose episode_id was read before: its row in the chunk, the id, and where it was first read."""

    row: int
    episode_id: str
    first: str


class SeenIds:
    """Every episode_id read so far and where, in sorted runs of (id, location) merged as they
    grow (a log-structured merge: each lookup is a binary search per run, log2(ids) runs)."""

    def __init__(self) -> None:
        self.sources: list[str] = []
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []
        self._other: dict[str, int] = {}  # ids that are not 16 hex digits

    def source(self, name: str) -> int:
        self.sources.append(name)
        return len(self.sources) - 1

    def _where(self, packed: int) -> str:
        return f"{self.sources[packed >> _LINE_BITS]}:{packed & ((1 << _LINE_BITS) - 1)}"

    def add(self, ids: pl.Series, lines: np.ndarray, source: int) -> list[Repeat]:
        """Record this chunk's ids (at `lines` of `source`); the rows whose id was read before."""
        n = len(ids)
        if n == 0 or ids.null_count() == n:
            return []
        here = (np.uint64(source) << np.uint64(_LINE_BITS)) | lines.astype(np.uint64)
        origin = here.copy()  # where each row's id was first read
        missing = ids.is_null().to_numpy()
        first = ids.is_first_distinct().to_numpy() | missing
        hexes = ids.str.contains(_HEX_ID).fill_null(False).to_numpy()
        seen = np.zeros(n, dtype=bool)
        rows = np.flatnonzero(hexes & first)
        keys = ids.gather(rows).str.to_integer(base=16, dtype=pl.UInt64).to_numpy()
        for run_keys, run_where in self._runs:
            at = np.searchsorted(run_keys, keys).clip(max=len(run_keys) - 1)
            hit = run_keys[at] == keys
            seen[rows[hit]] = True
            origin[rows[hit]] = run_where[at[hit]]
        fresh = ~seen[rows]
        self._push(keys[fresh], here[rows[fresh]])
        for r in np.flatnonzero(~hexes & first & ~missing).tolist():
            text = ids[r]
            known = self._other.get(text)
            if known is None:
                self._other[text] = int(here[r])
            else:
                seen[r], origin[r] = True, known
        again = np.flatnonzero(~first)
        if again.size:  # repeats inside the chunk: first read where their first row was
            index = pl.DataFrame({"id": ids}).with_row_index("row")
            firsts = index.select(pl.col("row").min().over("id")).to_series().to_numpy()
            origin[again] = origin[firsts[again]]
            seen[again] = True
        return [Repeat(int(r), str(ids[int(r)]), self._where(int(origin[r]))) for r in np.flatnonzero(seen)]

    def _push(self, keys: np.ndarray, where: np.ndarray) -> None:
        if keys.size == 0:
            return
        order = np.argsort(keys, kind="stable")
        self._runs.append((keys[order], where[order]))
        while len(self._runs) > 1 and len(self._runs[-1][0]) * 2 >= len(self._runs[-2][0]):
            (k2, w2), (k1, w1) = self._runs.pop(), self._runs.pop()
            k, w = np.concatenate([k1, k2]), np.concatenate([w1, w2])
            order = np.argsort(k, kind="stable")
            self._runs.append((k[order], w[order]))
