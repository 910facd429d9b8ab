"""Scored episodes read chunk by chunk into running totals: memory follows the cells, not the input.

Each source is read in chunks of about `chunks.CHUNK_BYTES` of whole lines; a line longer than
`dphil.io.jsonl.MAX_LINE` is refused (or, with `--on-error skip`, skipped) without being held
whole. Polars parses a chunk with an explicit schema (`dphil.results.fields`) that names only
the fields statistics need, into one derived row per episode; the rows are checked for
`episode_id`s read before (`--dedupe`; an errored attempt of an episode also read complete is
left out whichever comes first, as `dphil-rollout --resume` retries errors under the same id),
folded into the running totals of
`dphil.results.tally` and dropped. dphil-stats thus holds one chunk, each cell's totals, the
compared arms' values and the ids seen, however large its input.

Polars' own errors say "syntax at character 4" and nothing about where, so when a chunk
fails to parse, or a parsed row breaks the contract, that chunk is read again line by line
with `dphil.io.jsonl.RecordReader`, which reports the first bad line as `file:line: reason`
(or, with `--on-error skip`, leaves bad lines out and counts them). Episodes with
`status: "error"` are kept only to be counted: every statistic excludes them.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import polars as pl

from dphil.core.records import MAX_MAGNITUDE, SCHEMA_VERSIONS
from dphil.io.errors import DataError, UsageError
from dphil.io.jsonl import RecordReader, open_input, source_name
from dphil.results.chunks import line_chunks
from dphil.results.fields import _DERIVED, _KNOWN, _RAW, Compare, check_fields, derived_row
from dphil.results.tally import Arms, Key, Repeat, SeenIds, Totals

DEDUPE = ("fail", "first")

Warn = Callable[[str], None]
# Sees each chunk once it is read: its source, its bytes (whole lines) and its rows, in order.
Keep = Callable[[str, "bytes | None", pl.DataFrame], None]


def _silent(_: str) -> None:
    pass


# -- reading ------------------------------------------------------------------------------


@dataclass
class Episodes:
    """What reading keeps: the cells' running totals, the compared arms, the counts.

    `totals` are per value of every field read, free fields still as their text; `types`
    gives each field its final type (a free field is a number when every value is one)."""

    fields: list[str]
    totals: Totals
    arms: dict[Compare, Arms]
    types: dict[str, pl.DataType]
    count: int = 0  # episodes read and counted (complete and errored), each once
    skipped: int = 0  # bad lines left out (--on-error skip)
    dropped: int = 0  # repeated episodes left out (--dedupe first)
    superseded: int = 0  # errored attempts left out: the same episode was read complete
    present: set[str] = field(default_factory=set)  # the free fields some episode has

    def typed(self, keys: list[Key], names: Sequence[str]) -> list[Key]:
        """`keys` (values of `names`, free fields as text) with each field's final type."""
        if not keys:
            return []
        columns: list[list[Any]] = []
        for name, values in zip(names, zip(*keys, strict=True), strict=True):
            dtype = self.types[name]
            if name in _KNOWN or dtype == pl.String:
                columns.append(list(values))
            else:
                columns.append(pl.Series(values, dtype=pl.String).cast(dtype).to_list())
        return list(zip(*columns, strict=True))

    def check_read(self, names: Sequence[str]) -> None:
        missing = [f for f in names if f not in self.fields]
        if missing:
            raise UsageError(f"{', '.join(missing)}: not among the fields read ({', '.join(self.fields)})")

    def cells(self, by: Sequence[str]) -> pl.DataFrame:
        """One row per value of `by`: the typed keys and the totals `cells.cell_records` reads."""
        self.check_read(by)
        keys = self.totals.keys
        return self.totals.regrouped(by, lambda raw: self.typed(raw, keys)).summary(self.types)


def load(
    sources: Sequence[str],
    fields: Sequence[str],
    *,
    compares: Sequence[Compare] = (),
    arm_fields: Sequence[str] = (),
    on_error: str = "fail",
    dedupe: str = "fail",
    stdin: IO[bytes] | None = None,
    warn: Warn = _silent,
    keep: Keep | None = None,
) -> Episodes:
    """Read scored episodes from files or `-` into the totals of `fields` and the arms of `compares`.

    `dedupe`: an episode_id read complete before is a data error (`fail`), or the repeat is
    left out and counted (`first`). Either way an errored attempt of an episode that is also
    read complete is left out and counted (`superseded`), before or after the complete
    record: a journal that `dphil-rollout --resume` retried reads as its episodes, each once.
    `arm_fields` are read for the compared arms only (`--cluster`), never into the cells' totals.
    `keep`, when given, is called once per chunk after it is read
    (what the HTML report uses to take a few whole episodes per cell without reading stdin
    twice).
    """
    if dedupe not in DEDUPE:
        raise ValueError(f"dedupe must be one of {', '.join(DEDUPE)}, not {dedupe!r}")
    fields = list(dict.fromkeys([*fields, *(c.field for c in compares)]))
    extra = [f for f in dict.fromkeys(arm_fields) if f not in fields]
    check_fields([*fields, *extra])
    reading = _Reading(fields, compares, extra=extra, on_error=on_error, dedupe=dedupe, warn=warn, keep=keep)
    for src in list(sources) or ["-"]:
        reading.source(src, stdin)
    return reading.episodes()


class _Reading:
    """The state of one load: what every chunk is folded into."""

    def __init__(
        self,
        fields: list[str],
        compares: Sequence[Compare],
        *,
        extra: Sequence[str] = (),
        on_error: str,
        dedupe: str,
        warn: Warn,
        keep: Keep | None,
    ) -> None:
        self.fields = [*fields, *extra]  # everything read: the cells' fields, then the arms' own
        self.raw = dict(_RAW)
        for f in self.fields:
            self.raw.setdefault(f, _KNOWN.get(f, pl.String()))
        self.on_error, self.dedupe, self.warn, self.keep = on_error, dedupe, warn, keep
        self.totals = Totals(fields)
        self.arms = {
            c: Arms(c.field, [c.a, c.b], self.fields, typed=c.field in _KNOWN) for c in dict.fromkeys(compares)
        }
        self.seen = SeenIds()
        self.free = [f for f in self.fields if f not in _KNOWN]
        self.as_int = dict.fromkeys(self.free, True)
        self.as_float = dict.fromkeys(self.free, True)
        self.present: set[str] = set()
        self.count = self.skipped = self.dropped = self.superseded = 0
        # Errored attempts are held back until every source is read, since a complete record of
        # the same episode (a retry) may follow: the held rows, and for each id where its row is.
        self.held: list[pl.DataFrame] = []
        self.held_out: list[np.ndarray] = []  # per held frame, the rows a complete record superseded
        self.pending: dict[str, tuple[int, int]] = {}
        self.completed: dict[str, str] = {}  # ids first read as an error, then complete: where

    def source(self, src: str, stdin: IO[bytes] | None) -> None:
        name = source_name(src)
        stream = open_input(src, stdin)  # names a missing or unreadable file (exit 66)
        index = self.seen.source(name)
        try:
            for first_line, chunk in line_chunks(stream, name, self.bad):
                self.chunk(src, name, index, first_line, chunk)
        finally:
            if src != "-":
                stream.close()

    def bad(self, error: DataError) -> None:
        """A located bad line: raised, or with --on-error skip warned about and counted."""
        if self.on_error != "skip":
            raise error
        self.skipped += 1
        self.warn(error.message)

    def chunk(self, src: str, name: str, index: int, first_line: int, chunk: bytes) -> None:
        frame, lines, skipped = _read_chunk(name, chunk, first_line, self.raw, self.fields, self.on_error, self.warn)
        self.skipped += skipped
        if frame.height == 0:
            return
        repeats = self.seen.add(frame["_id"], lines, index)
        drop, hold = self._attempts(frame, lines, name, repeats)
        if drop:
            keep = np.ones(frame.height, dtype=bool)
            keep[drop] = False
            frame = frame.filter(pl.Series(keep))
            hold = [h - int(np.count_nonzero(np.asarray(drop) < h)) for h in hold]
        if self.keep is not None:  # held errors stay in its frame: it reads complete rows only
            self.keep(src, chunk, frame)
        if hold:
            mask = np.zeros(frame.height, dtype=bool)
            mask[hold] = True
            at = len(self.held)
            self.held.append(frame.filter(pl.Series(mask)))
            self.held_out.append(np.zeros(len(hold), dtype=bool))
            for i, row in enumerate(hold):
                self.pending[str(frame["_id"][row])] = (at, i)
            frame = frame.filter(pl.Series(~mask))
        self._fold(frame)

    def _attempts(
        self, frame: pl.DataFrame, lines: np.ndarray, name: str, repeats: list[Repeat]
    ) -> tuple[list[int], list[int]]:
        """The rows left out of this chunk and the errored attempts held back, in row order.

        An errored attempt is held until the end (folded then, unless a complete record of
        its episode supersedes it); an attempt of an episode read before, complete or not,
        is superseded at once. A complete record read twice follows `--dedupe`.
        """
        repeated = {r.row: r for r in repeats}
        errors = frame["_error"].fill_null(False).to_numpy()
        ids = frame["_id"]
        drop: list[int] = []
        hold: list[int] = []
        held_here: dict[str, int] = {}
        for row in sorted({*repeated, *np.flatnonzero(errors).tolist()}):
            eid, repeat = ids[row], repeated.get(row)
            if errors[row]:
                if eid is None:
                    continue  # no id to match a retry with: counted as it comes
                if repeat is None:
                    hold.append(row)
                    held_here[eid] = row
                else:
                    drop.append(row)
                    self.superseded += 1
            elif eid in held_here:  # its errored attempt is earlier in this chunk
                attempt = held_here.pop(eid)
                hold.remove(attempt)
                drop.append(attempt)
                self._supersede_done(eid, name, lines[row])
            elif eid in self.pending:
                at, i = self.pending.pop(eid)
                self.held_out[at][i] = True
                self._supersede_done(eid, name, lines[row])
            elif self.dedupe == "first":
                drop.append(row)
                self.dropped += 1
            else:
                shown = eid if len(eid) <= 40 else eid[:37] + "..."
                first = self.completed.get(eid) or (repeat.first if repeat is not None else name)
                self.bad(DataError(f"episode {shown} already read at {first}", source=name, line=int(lines[row])))
                drop.append(row)
        return sorted(drop), hold

    def _supersede_done(self, eid: str, name: str, line: Any) -> None:
        self.superseded += 1
        self.completed[eid] = f"{name}:{int(line)}"

    def _fold(self, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        self.count += frame.height
        for f in self.free:
            col = frame[f]
            nulls = col.null_count()
            if nulls < len(col):
                self.present.add(f)
            if self.as_int[f]:
                self.as_int[f] = col.cast(pl.Int64, strict=False).null_count() == nulls
            if self.as_float[f]:
                self.as_float[f] = col.cast(pl.Float64, strict=False).null_count() == nulls
        self.totals.add(frame)
        for arms in self.arms.values():
            arms.add(frame)

    def episodes(self) -> Episodes:
        for frame, out in zip(self.held, self.held_out, strict=True):  # the errors never retried
            self._fold(frame.filter(pl.Series(~out)))
        types = {f: _KNOWN[f] for f in self.fields if f in _KNOWN}
        for f in self.free:
            types[f] = pl.Int64() if self.as_int[f] else pl.Float64() if self.as_float[f] else pl.String()
        return Episodes(
            self.fields,
            self.totals,
            self.arms,
            types,
            self.count,
            self.skipped,
            self.dropped,
            self.superseded,
            self.present,
        )


def _read_chunk(
    name: str, chunk: bytes, first_line: int, raw: dict[str, pl.DataType], fields: list[str], on_error: str, warn: Warn
) -> tuple[pl.DataFrame, np.ndarray, int]:
    """One chunk's derived rows, the line of each, and the bad lines skipped."""
    try:
        parsed = pl.read_ndjson(io.BytesIO(chunk), schema=raw)
        frame = _derive(parsed, fields)
        if not _has_bad_rows(parsed, frame, fields):
            lines = _row_lines(chunk, first_line, frame.height)
            if lines is not None:
                return frame, lines, 0
    except (pl.exceptions.PolarsError, OSError):
        pass
    return _load_slowly(name, chunk, first_line, fields, on_error, warn)


def _row_lines(chunk: bytes, first_line: int, rows: int) -> np.ndarray | None:
    """The line of each row polars read from `chunk` (which skips blank lines); None if they disagree."""
    body = chunk[:-1] if chunk.endswith(b"\n") else chunk
    if (body.count(b"\n") + 1 if body else 0) == rows:  # a row a line: no line was blank
        return np.arange(first_line, first_line + rows, dtype=np.int64)
    numbers = [i for i, text in enumerate(body.split(b"\n"), first_line) if text.strip(b" \t\r")]
    return np.array(numbers, dtype=np.int64) if len(numbers) == rows else None


def _derive(parsed: pl.DataFrame, fields: list[str]) -> pl.DataFrame:
    ok = pl.col("status") == "complete"

    def when_ok(expr: pl.Expr) -> pl.Expr:
        return pl.when(ok).then(expr)

    reward, metrics, usage = pl.col("reward"), pl.col("metrics"), pl.col("usage")
    turns = pl.col("turns")
    action_null = pl.element().struct.field("action").is_null()
    failed = pl.element().struct.field("action").is_not_null() & ~pl.element().struct.field("ok")
    n_turns = turns.list.len()
    n_null = turns.list.eval(action_null).list.sum()
    return parsed.select(
        # Free fields stay text until every chunk is read (`Episodes.types`): a seed read as an integer too.
        *(pl.col(f) if f in _KNOWN else pl.col(f).cast(pl.String) for f in fields),
        pl.col("episode_id").alias("_id"),
        (~ok).fill_null(True).alias("_error"),
        pl.col("seed").cast(pl.String).alias("_seed"),
        when_ok(reward.struct.field("total")).alias("_reward"),
        when_ok(reward.struct.field("variant")).alias("_variant"),
        when_ok(pl.col("deadlock")).alias("_deadlock"),
        when_ok(pl.col("meals").list.sum()).alias("_meals"),
        when_ok(metrics.struct.field("throughput_per_round")).alias("_throughput"),
        when_ok(metrics.struct.field("gini_fairness")).alias("_gini"),
        when_ok(metrics.struct.field("starvation")).alias("_starvation"),
        when_ok(metrics.struct.field("time_to_deadlock")).alias("_ttd"),
        when_ok(metrics.struct.field("message_consistency")).alias("_consistency"),
        when_ok(n_turns.cast(pl.Int64)).alias("_turns"),
        when_ok(n_null.cast(pl.Int64)).alias("_null"),
        when_ok((n_turns - n_null).cast(pl.Int64)).alias("_acted"),
        when_ok(turns.list.eval(failed).list.sum().cast(pl.Int64)).alias("_failed"),
        usage.struct.field("prompt_tokens").fill_null(0).alias("_prompt_tokens"),
        usage.struct.field("completion_tokens").fill_null(0).alias("_completion_tokens"),
        usage.struct.field("cost").fill_null(0.0).alias("_cost"),
    )


def _has_bad_rows(parsed: pl.DataFrame, frame: pl.DataFrame, fields: list[str]) -> bool:
    """Whether any row breaks the contract, checked column-wise (the slow path says which).

    A row without a `schema_version` goes the slow way too: only that way tells a missing
    field (a hand-written record, read as the current version) from a null one (refused)."""
    if parsed.height == 0:
        return False
    ok = pl.col("status") == "complete"
    metrics = pl.col("metrics")

    def beyond(expr: pl.Expr) -> pl.Expr:
        return expr.abs() > MAX_MAGNITUDE

    turns_ok = pl.col("turns").list.eval(pl.element().struct.field("ok").is_null() | pl.element().is_null()).list.any()
    checks = [
        pl.col("kind").is_not_null() & (pl.col("kind") != "episode"),
        ~pl.col("schema_version").is_in(SCHEMA_VERSIONS).fill_null(False),
        ~pl.col("status").is_in(["complete", "error"]).fill_null(False),
        pl.col("episode_id").str.starts_with("{") | pl.col("episode_id").str.starts_with("["),
        beyond(pl.col("usage").struct.field("cost")),
        ok
        & (
            pl.col("reward").struct.field("total").is_null()
            | pl.col("deadlock").is_null()
            | pl.col("meals").is_null()
            | pl.col("meals").list.eval(pl.element().is_null()).list.any()
            | pl.col("turns").is_null()
            | turns_ok
            | metrics.struct.field("throughput_per_round").is_null()
            | metrics.struct.field("gini_fairness").is_null()
            | metrics.struct.field("starvation").is_null()
            | beyond(pl.col("reward").struct.field("total"))
            | beyond(metrics.struct.field("throughput_per_round"))
            | beyond(metrics.struct.field("gini_fairness"))
            | ~metrics.struct.field("message_consistency").is_between(0, 1).fill_null(True)
        ),
    ]
    for f in fields:
        if f not in _KNOWN and parsed.schema[f] == pl.String:
            # Objects and arrays arrive as their JSON text; the slow path refuses them.
            checks.append(pl.col(f).str.starts_with("{") | pl.col(f).str.starts_with("["))
    bad = parsed.select(pl.any_horizontal(checks).fill_null(False).any()).item()
    return bool(bad)


def _load_slowly(
    name: str, data: bytes, first_line: int, fields: list[str], on_error: str, warn: Warn
) -> tuple[pl.DataFrame, np.ndarray, int]:
    """Read one chunk record by record: locate the first bad line, or skip bad lines."""
    reader = RecordReader(["-"], on_error=on_error, stdin=io.BytesIO(data), warn=warn, name=name, first_line=first_line)
    columns: dict[str, list[Any]] = {name: [] for name in [*fields, *_DERIVED]}
    lines: list[int] = []
    for record in reader:
        try:
            row = derived_row(record, fields)
        except DataError as e:
            reader.reject(e)
            continue
        for column, value in zip(columns, row, strict=True):
            columns[column].append(value)
        lines.append(reader.line)
    schema = {f: _KNOWN.get(f, pl.String()) for f in fields} | _DERIVED
    frame = pl.DataFrame(columns, schema=schema, strict=False)
    return frame, np.array(lines, dtype=np.int64), reader.skipped
