"""Scored episodes read into one polars frame: a row per episode, its grouping fields and measures.

Reading is built for a million episodes: polars parses each source with an explicit
schema (`dphil.results.fields`) that names only the fields statistics need, so nothing
else is materialised. Polars' own errors say "syntax at character 4" and
nothing about where, so when a source fails to parse, or a parsed row breaks the
contract, that source is read again line by line with `dphil.io.jsonl.RecordReader`,
which reports the first bad line as `file:line: reason` (or, with `--on-error skip`,
leaves bad lines out and counts them). Episodes with `status: "error"` are kept only
to be counted: every statistic excludes them.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeGuard

import polars as pl

from dphil.core.records import checked_outcome, is_int
from dphil.io.errors import DataError
from dphil.io.jsonl import RecordReader, open_input, source_name
from dphil.results.fields import _DERIVED, _KNOWN, _RAW, check_fields

_BOM = b"\xef\xbb\xbf"

Warn = Callable[[str], None]
# Sees each source once it is read: its name, its bytes when they were read into memory
# (stdin, gzip, pipes; None for a plain file polars read itself) and its rows.
Keep = Callable[[str, "bytes | None", pl.DataFrame], None]


def _silent(_: str) -> None:
    pass


# -- reading ------------------------------------------------------------------------------


@dataclass
class Episodes:
    """One row per episode (grouping fields + derived measures) and what reading left out."""

    frame: pl.DataFrame
    fields: list[str]
    skipped: int = 0


def load(
    sources: Sequence[str],
    fields: Sequence[str],
    *,
    on_error: str = "fail",
    stdin: IO[bytes] | None = None,
    warn: Warn = _silent,
    keep: Keep | None = None,
) -> Episodes:
    """Read scored episodes from files or `-`, keeping `fields` and the measures.

    `keep`, when given, is called once per source after it is read (what the
    HTML report uses to take a few whole episodes per cell without reading
    stdin twice).
    """
    fields = list(dict.fromkeys(fields))
    check_fields(fields)
    raw = dict(_RAW)
    for f in fields:
        raw.setdefault(f, _KNOWN.get(f, pl.String()))
    frames: list[pl.DataFrame] = []
    skipped = 0
    for src in list(sources) or ["-"]:
        frame, bad, data = _load_source(src, raw, fields, on_error, stdin, warn)
        if keep is not None:
            keep(src, data, frame)
        del data
        frames.append(frame)
        skipped += bad
    frame = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]
    frame = _type_free_fields(frame, fields)
    return Episodes(frame, fields, skipped)


def _load_source(
    src: str,
    raw: dict[str, pl.DataType],
    fields: list[str],
    on_error: str,
    stdin: IO[bytes] | None,
    warn: Warn,
) -> tuple[pl.DataFrame, int, bytes | None]:
    data: bytes | None = None
    if src == "-":
        data = _read_all(src, open_input(src, stdin))
    else:
        stream = open_input(src)  # names a missing or unreadable file (exit 66)
        try:
            head = stream.peek(3)[:3] if hasattr(stream, "peek") else b""
            # Polars reads regular plain files itself (memory-mapped); gzip, a BOM and
            # pipes such as <(zcat ep.jsonl.gz) are read here, once.
            if (
                isinstance(stream, gzip.GzipFile)
                or head.startswith(_BOM)
                or not stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
            ):
                data = _read_all(src, stream)
        finally:
            stream.close()
    try:
        parsed = pl.read_ndjson(io.BytesIO(data) if data is not None else src, schema=raw)
        frame = _derive(parsed, fields)
        if not _has_bad_rows(parsed, frame, fields):
            return frame, 0, data
    except (pl.exceptions.PolarsError, OSError):
        pass
    return (*_load_slowly(src, data, fields, on_error, warn), data)


def _read_all(src: str, stream: IO[bytes]) -> bytes:
    try:
        data = stream.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read: {e}", source=source_name(src)) from None
    return data[3:] if data.startswith(_BOM) else data


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
        *(pl.col(f) for f in fields),
        (~ok).fill_null(True).alias("_error"),
        pl.col("seed").alias("_seed"),
        when_ok(reward.struct.field("total")).alias("_reward"),
        when_ok(reward.struct.field("variant")).alias("_variant"),
        when_ok(pl.col("deadlock")).alias("_deadlock"),
        when_ok(pl.col("meals").list.sum()).alias("_meals"),
        when_ok(metrics.struct.field("throughput_per_round")).alias("_throughput"),
        when_ok(metrics.struct.field("gini_fairness")).alias("_gini"),
        when_ok(metrics.struct.field("starvation")).alias("_starvation"),
        when_ok(metrics.struct.field("time_to_deadlock")).alias("_ttd"),
        when_ok(n_turns.cast(pl.Int64)).alias("_turns"),
        when_ok(n_null.cast(pl.Int64)).alias("_null"),
        when_ok((n_turns - n_null).cast(pl.Int64)).alias("_acted"),
        when_ok(turns.list.eval(failed).list.sum().cast(pl.Int64)).alias("_failed"),
        usage.struct.field("prompt_tokens").fill_null(0).alias("_prompt_tokens"),
        usage.struct.field("completion_tokens").fill_null(0).alias("_completion_tokens"),
        usage.struct.field("cost").fill_null(0.0).alias("_cost"),
    )


def _has_bad_rows(parsed: pl.DataFrame, frame: pl.DataFrame, fields: list[str]) -> bool:
    """Whether any row breaks the contract, checked column-wise (the slow path says which)."""
    if parsed.height == 0:
        return False
    ok = pl.col("status") == "complete"
    metrics = pl.col("metrics")
    turns_ok = pl.col("turns").list.eval(pl.element().struct.field("ok").is_null() | pl.element().is_null()).list.any()
    checks = [
        pl.col("kind").is_not_null() & (pl.col("kind") != "episode"),
        ~pl.col("status").is_in(["complete", "error"]).fill_null(False),
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
        ),
    ]
    for f in fields:
        if f not in _KNOWN:
            # Objects and arrays arrive as their JSON text; the slow path refuses them.
            checks.append(pl.col(f).str.starts_with("{") | pl.col(f).str.starts_with("["))
    bad = parsed.select(pl.any_horizontal(checks).fill_null(False).any()).item()
    return bool(bad)


def _load_slowly(
    src: str, data: bytes | None, fields: list[str], on_error: str, warn: Warn
) -> tuple[pl.DataFrame, int]:
    """Read one source record by record: locate the first bad line, or skip bad lines."""
    if data is not None:
        reader = RecordReader(["-"], on_error=on_error, stdin=io.BytesIO(data), warn=warn)
        reader_source = source_name(src)
    else:
        reader = RecordReader([src], on_error=on_error, warn=warn)
        reader_source = None
    columns: dict[str, list[Any]] = {name: [] for name in [*fields, *_DERIVED]}
    try:
        for record in reader:
            try:
                row = _row(record, fields)
            except DataError as e:
                reader.reject(e)
                continue
            for name, value in zip(columns, row, strict=True):
                columns[name].append(value)
    except DataError as e:
        if reader_source is not None and e.source == "<stdin>":
            raise e.at(reader_source, e.line or 0) from None
        raise
    schema = {f: _KNOWN.get(f, pl.String()) for f in fields} | _DERIVED
    return pl.DataFrame(columns, schema=schema, strict=False), reader.skipped


def _row(record: dict[str, Any], fields: list[str]) -> list[Any]:
    """The frame row of one record, or DataError saying what is wrong with it."""
    kind = record.get("kind", "episode")
    if kind != "episode":
        raise DataError(f"expected a scored episode, got a record of kind {kind!r}")
    status = record.get("status")
    if status not in ("complete", "error"):
        if "status" not in record:
            raise DataError("missing field 'status'")
        raise DataError(f"field 'status' should be 'complete' or 'error', got {status!r}")
    values: list[Any] = [_field(record, f) for f in fields]
    seed = record.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise DataError("field 'seed' should be an integer")
    values.append(status == "error")
    values.append(None if seed is None else str(seed))
    usage = _usage(record.get("usage"))
    if status == "error":
        return [*values, *([None] * 12), *usage]
    reward = record.get("reward")
    if not isinstance(reward, dict):
        raise DataError("episode is not scored (no 'reward' object): run dphil-score first")
    total = reward.get("total")
    if not _is_number(total):
        raise DataError("field 'reward.total' should be a number")
    variant = reward.get("variant")
    meals, deadlock = checked_outcome(record)
    turns = record.get("turns")
    if not isinstance(turns, list):
        raise DataError("field 'turns' should be a list")
    n_null = n_failed = 0
    for k, t in enumerate(turns):
        if not isinstance(t, dict) or not isinstance(t.get("ok"), bool):
            raise DataError(f"turns[{k}] should be an object with a boolean 'ok'")
        action = t.get("action")
        if action is None:
            n_null += 1
        elif not isinstance(action, str):
            raise DataError(f"turns[{k}].action should be a string or null")
        elif not t["ok"]:
            n_failed += 1
    metrics = record.get("metrics")
    if not isinstance(metrics, dict):
        raise DataError("episode is not scored (no 'metrics' object): run dphil-score first")
    for name, check in (("throughput_per_round", _is_number), ("gini_fairness", _is_number), ("starvation", is_int)):
        if not check(metrics.get(name)):
            raise DataError(f"field 'metrics.{name}' should be a number")
    ttd = metrics.get("time_to_deadlock")
    if ttd is not None and not is_int(ttd):
        raise DataError("field 'metrics.time_to_deadlock' should be an integer or null")
    return [
        *values,
        float(total),
        variant if isinstance(variant, str) else None,
        deadlock,
        sum(meals),
        float(metrics["throughput_per_round"]),
        float(metrics["gini_fairness"]),
        metrics["starvation"],
        ttd,
        len(turns),
        n_null,
        len(turns) - n_null,
        n_failed,
        *usage,
    ]


def _field(record: dict[str, Any], name: str) -> Any:
    value = record.get(name)
    if isinstance(value, dict | list):
        raise DataError(
            f"field {name!r} is an {'object' if isinstance(value, dict) else 'array'}; "
            "--by and --compare need a single value"
        )
    known = _KNOWN.get(name)
    if known is None:
        # Text, as polars reads free fields; numbers are restored for the whole column later.
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)
    if value is None:
        return None
    if isinstance(known, pl.String):
        return value if isinstance(value, str) else str(value)
    if isinstance(known, pl.Boolean):
        if not isinstance(value, bool):
            raise DataError(f"field {name!r} should be true or false")
        return value
    if not is_int(value):
        raise DataError(f"field {name!r} should be an integer")
    return value


def _usage(usage: Any) -> list[Any]:
    if usage is None:
        return [0, 0, 0.0]
    if not isinstance(usage, dict):
        raise DataError("field 'usage' should be an object")
    out: list[Any] = []
    for name, check in (("prompt_tokens", is_int), ("completion_tokens", is_int), ("cost", _is_number)):
        value = usage.get(name)
        if value is not None and not check(value):
            raise DataError(f"field 'usage.{name}' should be a number")
        out.append(value if value is not None else 0)
    out[2] = float(out[2])
    return out


def _is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _type_free_fields(frame: pl.DataFrame, fields: list[str]) -> pl.DataFrame:
    """Give free-form grouping fields a number type when every value is one."""
    for f in fields:
        if f in _KNOWN or frame.schema[f] != pl.String:
            continue
        col = frame[f]
        for dtype in (pl.Int64, pl.Float64):
            cast = col.cast(dtype, strict=False)
            if cast.null_count() == col.null_count():
                frame = frame.with_columns(cast.alias(f))
                break
    return frame
