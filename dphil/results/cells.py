"""From scored episodes to the records of a results table: cells and comparisons.

Reading is built for a million episodes: polars parses each source with an explicit
schema that names only the fields statistics need (turns as just their `action` and `ok`),
so nothing else is materialised. Polars' own errors say "syntax at character 4" and
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
from typing import IO, Any

import polars as pl

from dphil.core.records import SCHEMA_VERSION, checked_outcome, is_int
from dphil.io.errors import DataError, UsageError
from dphil.io.jsonl import RecordReader, open_input, source_name
from dphil.results import maths as stats

DEFAULT_BY = ("model", "n")
DEGENERATE_WARN = 0.25
_BOM = b"\xef\xbb\xbf"

# Contract fields with a known type; any other --by field is read as text and given a
# number type afterwards when every value is one (e.g. checkpoint_step).
_KNOWN: dict[str, pl.DataType] = {
    "model": pl.String(),
    "n": pl.Int64(),
    "rounds": pl.Int64(),
    "protocol": pl.String(),
    "schedule": pl.String(),
    "conflict": pl.String(),
    "deadlock_mode": pl.String(),
    "episode_id": pl.String(),
    "dphil_version": pl.String(),
    "kind": pl.String(),
    "status": pl.String(),
    "deadlock": pl.Boolean(),
    "schema_version": pl.Int64(),
    "deadlock_round": pl.Int64(),
    "rounds_played": pl.Int64(),
}
_OBJECTS = ("reward", "metrics", "turns", "meals", "usage", "events", "deadlock_rounds")

_RAW: dict[str, pl.DataType] = {
    "kind": pl.String(),
    "status": pl.String(),
    "seed": pl.String(),
    "deadlock": pl.Boolean(),
    "meals": pl.List(pl.Int64()),
    "reward": pl.Struct({"variant": pl.String(), "total": pl.Float64()}),
    "metrics": pl.Struct(
        {
            "throughput_per_round": pl.Float64(),
            "gini_fairness": pl.Float64(),
            "starvation": pl.Int64(),
            "time_to_deadlock": pl.Int64(),
        }
    ),
    "turns": pl.List(pl.Struct({"action": pl.String(), "ok": pl.Boolean()})),
    "usage": pl.Struct({"prompt_tokens": pl.Int64(), "completion_tokens": pl.Int64(), "cost": pl.Float64()}),
}

# One row per episode after reading: the grouping fields plus these.
_DERIVED: dict[str, pl.DataType] = {
    "_error": pl.Boolean(),
    "_seed": pl.String(),
    "_reward": pl.Float64(),
    "_variant": pl.String(),
    "_deadlock": pl.Boolean(),
    "_meals": pl.Int64(),
    "_throughput": pl.Float64(),
    "_gini": pl.Float64(),
    "_starvation": pl.Int64(),
    "_ttd": pl.Int64(),
    "_turns": pl.Int64(),
    "_null": pl.Int64(),
    "_acted": pl.Int64(),
    "_failed": pl.Int64(),
    "_prompt_tokens": pl.Int64(),
    "_completion_tokens": pl.Int64(),
    "_cost": pl.Float64(),
}

# Names a cell or comparison record uses itself; a grouping field may not take them.
_RESERVED = frozenset(
    {
        "kind",
        "schema_version",
        "episodes",
        "errors",
        "reward_variant",
        "reward_mean",
        "reward_std",
        "reward_ci",
        "deadlocks",
        "deadlock_rate",
        "deadlock_ci",
        "meals_mean",
        "zero_meal_rate",
        "degenerate_rate",
        "throughput_mean",
        "gini_fairness_mean",
        "starvation_mean",
        "time_to_deadlock_mean",
        "null_action_rate",
        "failed_action_rate",
        "turns",
        "prompt_tokens",
        "completion_tokens",
        "cost",
        "field",
        "a",
        "b",
        "diff",
        "diff_ci",
        "welch_t",
        "df",
        "p_value",
        "p_adjusted",
        "adjust",
        "hedges_g",
        "hedges_g_ci",
        "deadlock",
        "paired",
        "paired_tests",
        "power",
        "notes",
    }
)

Warn = Callable[[str], None]
# Sees each source once it is read: its name, its bytes when they were read into memory
# (stdin, gzip, pipes; None for a plain file polars read itself) and its rows.
Keep = Callable[[str, "bytes | None", pl.DataFrame], None]


def _silent(_: str) -> None:
    pass


@dataclass(frozen=True)
class Compare:
    """`--compare FIELD A B`: B against A, within each group of the other --by fields."""

    field: str
    a: str
    b: str


def parse_by(text: str) -> list[str]:
    """`model,n` -> ["model", "n"], refusing names the records cannot be grouped by."""
    fields = [f.strip() for f in text.split(",") if f.strip()]
    if not fields:
        raise UsageError("--by needs at least one field name")
    check_fields(fields)
    if len(set(fields)) != len(fields):
        raise UsageError(f"--by names a field twice: {text}")
    return fields


def check_fields(fields: Sequence[str]) -> None:
    for f in fields:
        if f in _OBJECTS:
            raise UsageError(f"cannot group by {f!r}: it is not a single value per episode")
        if f in _RESERVED or f.startswith("_"):
            raise UsageError(f"cannot group by {f!r}: the name is taken by the output records")


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


def _is_number(v: Any) -> bool:
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


# -- cells --------------------------------------------------------------------------------


def cell_records(
    episodes: Episodes,
    by: Sequence[str],
    *,
    degenerate_warn: float = DEGENERATE_WARN,
    warn: Warn = _silent,
    confidence: float = stats.CONFIDENCE,
) -> list[dict[str, Any]]:
    """One `kind: "cell"` record per value of the `by` fields, in sorted order."""
    frame = episodes.frame
    if frame.height == 0:
        return []
    by = list(by)
    c = pl.col
    summary = (
        frame.group_by(by)
        .agg(
            c("_reward").count().alias("episodes"),
            c("_error").sum().alias("errors"),
            c("_variant").drop_nulls().unique().sort().alias("variants"),
            c("_reward").mean().alias("reward_mean"),
            c("_reward").std(ddof=1).alias("reward_std"),
            c("_deadlock").sum().alias("deadlocks"),
            c("_meals").mean().alias("meals_mean"),
            (c("_meals") == 0).sum().alias("zero_meals"),
            ((c("_meals") == 0) & ~c("_deadlock")).sum().alias("degenerate"),
            c("_throughput").mean().alias("throughput_mean"),
            c("_gini").mean().alias("gini_fairness_mean"),
            c("_starvation").mean().alias("starvation_mean"),
            c("_ttd").mean().alias("time_to_deadlock_mean"),
            c("_turns").sum().alias("turns"),
            c("_null").sum().alias("null"),
            c("_acted").sum().alias("acted"),
            c("_failed").sum().alias("failed"),
            c("_prompt_tokens").sum().alias("prompt_tokens"),
            c("_completion_tokens").sum().alias("completion_tokens"),
            c("_cost").sum().alias("cost"),
        )
        .sort(by, nulls_last=True)
    )
    records = []
    for row in summary.iter_rows(named=True):
        group = {f: row[f] for f in by}
        label = _label(group)
        if len(row["variants"]) > 1:
            raise DataError(
                f"cell {label} mixes reward variants {' and '.join(row['variants'])}: "
                "score all episodes the same way (dphil-score) before comparing them"
            )
        n = row["episodes"]
        errors = row["errors"]
        ci = stats.mean_ci_from(n, row["reward_mean"], row["reward_std"], confidence)
        dl = row["deadlocks"] if n else None
        wil = stats.wilson(dl, n, confidence) if n else None
        record: dict[str, Any] = {
            "kind": "cell",
            "schema_version": SCHEMA_VERSION,
            **group,
            "episodes": n,
            "errors": errors,
            "reward_variant": row["variants"][0] if row["variants"] else None,
            "reward_mean": ci.mean,
            "reward_std": ci.sd,
            "reward_ci": _pair(ci.lo, ci.hi),
            "deadlocks": dl,
            "deadlock_rate": _rate(dl, n),
            "deadlock_ci": list(wil) if wil else None,
            "meals_mean": row["meals_mean"],
            "zero_meal_rate": _rate(row["zero_meals"], n),
            "degenerate_rate": _rate(row["degenerate"], n),
            "throughput_mean": row["throughput_mean"],
            "gini_fairness_mean": row["gini_fairness_mean"],
            "starvation_mean": row["starvation_mean"],
            "time_to_deadlock_mean": row["time_to_deadlock_mean"],
            "null_action_rate": _rate(row["null"], row["turns"]),
            "failed_action_rate": _rate(row["failed"], row["acted"]),
            "turns": row["turns"] or 0,
            "prompt_tokens": row["prompt_tokens"] or 0,
            "completion_tokens": row["completion_tokens"] or 0,
            "cost": row["cost"] or 0.0,
        }
        records.append(record)
        if errors:
            warn(f"{label}: {errors} errored episode(s) left out of every statistic")
        if n == 0:
            warn(f"{label}: no complete episodes, nothing to summarise")
        elif record["degenerate_rate"] >= degenerate_warn:
            warn(
                f"{label}: {row['degenerate']} of {n} episodes are degenerate (no deadlock and "
                "no meals): their no-deadlock reward measures inaction, not coordination"
            )
    return records


def _label(group: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in group.items()) or "all episodes"


def _rate(k: int | None, n: int | None) -> float | None:
    return k / n if n and k is not None else None


def _pair(lo: float | None, hi: float | None) -> list[float] | None:
    return None if lo is None or hi is None else [lo, hi]


# -- comparisons --------------------------------------------------------------------------


def comparison_records(
    episodes: Episodes,
    by: Sequence[str],
    compares: Sequence[Compare],
    *,
    adjust: str = "holm",
    power: bool = False,
    effect: float | None = None,
    warn: Warn = _silent,
    confidence: float = stats.CONFIDENCE,
) -> list[dict[str, Any]]:
    """One `kind: "comparison"` record per --compare and group of the other `by` fields,
    with p values adjusted for multiplicity across all of them (per test)."""
    if adjust not in stats.ADJUSTMENTS:
        raise UsageError(f"unknown --adjust {adjust!r}")
    frame = episodes.frame
    records: list[dict[str, Any]] = []
    for comp in compares:
        if comp.a == comp.b:
            raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: A and B are the same")
        if comp.field not in frame.columns:
            raise UsageError(f"--compare {comp.field}: the field was not read")
        text = pl.col(comp.field).cast(pl.String)
        arms = frame.filter(text.is_in([comp.a, comp.b])).with_columns((text == comp.b).alias("_is_b"))
        for value in (comp.a, comp.b):
            if arms.filter(text == value).height == 0:
                raise UsageError(f"--compare {comp.field} {comp.a} {comp.b}: no episodes with {comp.field} = {value!r}")
        rest = [f for f in by if f != comp.field]
        if rest:
            parts = arms.sort(rest, nulls_last=True).partition_by(rest, as_dict=True, maintain_order=True)
        else:
            parts = {(): arms}
        for key, part in parts.items():
            group = dict(zip(rest, key, strict=True))
            a, b = part.filter(~pl.col("_is_b")), part.filter(pl.col("_is_b"))
            if a.height == 0 or b.height == 0:
                missing = comp.a if a.height == 0 else comp.b
                warn(f"{_label(group)}: no episodes with {comp.field} = {missing!r}; comparison skipped")
                continue
            records.append(_compare(comp, group, a, b, power=power, effect=effect, confidence=confidence))
    _adjust_all(records, adjust)
    return records


def _compare(
    comp: Compare,
    group: dict[str, Any],
    a: pl.DataFrame,
    b: pl.DataFrame,
    *,
    power: bool,
    effect: float | None,
    confidence: float,
) -> dict[str, Any]:
    notes: list[str] = []
    a_ok, b_ok = a.filter(~pl.col("_error")), b.filter(~pl.col("_error"))
    ra, rb = a_ok["_reward"].to_numpy(), b_ok["_reward"].to_numpy()
    na, nb = len(ra), len(rb)
    ka, kb = int(a_ok["_deadlock"].sum()), int(b_ok["_deadlock"].sum())
    welch = stats.welch(ra, rb, confidence)
    g = stats.hedges_g(ra, rb, confidence)
    prop = stats.two_proportions(ka, na, kb, nb, confidence)
    if na < 2 or nb < 2:
        notes.append("an arm has fewer than 2 complete episodes: tests and effect size undefined")
    elif welch.t is None:
        notes.append("both arms have zero reward variance: t test and effect size undefined")
    elif g.g is None:
        notes.append("pooled reward SD is 0: effect size undefined")
    record: dict[str, Any] = {
        "kind": "comparison",
        "schema_version": SCHEMA_VERSION,
        **group,
        "field": comp.field,
        "a": _arm(a[comp.field][0], a, a_ok, ra, ka, confidence),
        "b": _arm(b[comp.field][0], b, b_ok, rb, kb, confidence),
        "diff": welch.diff,
        "diff_ci": _pair(welch.lo, welch.hi),
        "welch_t": welch.t,
        "df": welch.df,
        "p_value": welch.p_value,
        "p_adjusted": welch.p_value,
        "adjust": "none",
        "hedges_g": g.g,
        "hedges_g_ci": _pair(g.lo, g.hi),
        "deadlock": {
            "a_rate": _rate(ka, na),
            "b_rate": _rate(kb, nb),
            "diff": prop.diff,
            "diff_ci": _pair(prop.lo, prop.hi),
            "test": prop.test,
            "p_value": prop.p_value,
            "p_adjusted": prop.p_value,
        },
        "paired": False,
        "paired_tests": None,
    }
    pairs = _pairs(a_ok, b_ok, notes)
    if pairs is not None:
        pt = stats.paired(pairs["_reward"].to_numpy(), pairs["_reward_b"].to_numpy(), confidence)
        mc = stats.mcnemar(pairs["_deadlock"].to_numpy(), pairs["_deadlock_b"].to_numpy())
        record["paired"] = True
        record["paired_tests"] = {
            "pairs": pt.pairs,
            "diff": pt.diff,
            "diff_ci": _pair(pt.lo, pt.hi),
            "t": pt.t,
            "df": pt.df,
            "p_value": pt.p_value,
            "p_adjusted": pt.p_value,
            "wilcoxon_w": pt.wilcoxon_w,
            "wilcoxon_p": pt.wilcoxon_p,
            "wilcoxon_p_adjusted": pt.wilcoxon_p,
            "mcnemar": {
                "only_a": mc.only_a,
                "only_b": mc.only_b,
                "p_value": mc.p_value,
                "p_adjusted": mc.p_value,
            },
        }
        if pt.t is None and pt.pairs >= 2:
            notes.append("every paired difference is the same: paired t undefined")
    if power:
        record["power"] = _power(g.g, effect, na, nb, notes)
    record["notes"] = notes
    return record


def _arm(
    value: Any,
    all_rows: pl.DataFrame,
    ok: pl.DataFrame,
    rewards: Any,
    deadlocks: int,
    confidence: float,
) -> dict[str, Any]:
    ci = stats.mean_ci(rewards, confidence)
    return {
        "value": value,
        "episodes": ci.n,
        "errors": all_rows.height - ok.height,
        "reward_mean": ci.mean,
        "reward_std": ci.sd,
        "reward_ci": _pair(ci.lo, ci.hi),
        "deadlocks": deadlocks,
        "deadlock_rate": _rate(deadlocks, ci.n),
    }


def _pairs(a: pl.DataFrame, b: pl.DataFrame, notes: list[str]) -> pl.DataFrame | None:
    """Episodes matched by seed, when both arms use each seed at most once and share >= 2."""
    sa, sb = a["_seed"], b["_seed"]
    if sa.null_count() or sb.null_count():
        return None
    if sa.n_unique() != len(sa) or sb.n_unique() != len(sb):
        shared = set(sa.to_list()) & set(sb.to_list())
        if shared:
            notes.append("seeds repeat within an arm: episodes cannot be paired by seed")
        return None
    cols = ["_seed", "_reward", "_deadlock"]
    joined = a.select(cols).join(b.select(cols), on="_seed", how="inner", suffix="_b")
    if joined.height < 2:
        return None
    unmatched = len(sa) + len(sb) - 2 * joined.height
    if unmatched:
        notes.append(
            f"paired tests use the {joined.height} seeds found in both arms; "
            f"{unmatched} episode(s) without a partner are left out of them"
        )
    return joined.sort("_seed")


def _power(observed: float | None, effect: float | None, na: int, nb: int, notes: list[str]) -> dict[str, Any]:
    g = effect if effect is not None else observed
    block: dict[str, Any] = {
        "effect_g": g,
        "effect_source": "given" if effect is not None else "observed",
        "alpha": stats.ALPHA,
        "target_power": stats.POWER,
        "episodes_per_arm": stats.sample_size(g) if g is not None else None,
        "power_now": stats.power(g, na, nb) if g is not None else None,
        "detectable_g": stats.detectable_effect(na, nb),
    }
    if not g:
        notes.append("no effect size to plan for: give --effect G")
    return block


def _adjust_all(records: list[dict[str, Any]], method: str) -> None:
    """Adjust each test's p values across all comparisons of the run."""
    families: list[tuple[Callable[[dict], dict | None], str, str]] = [
        (lambda r: r, "p_value", "p_adjusted"),
        (lambda r: r["deadlock"], "p_value", "p_adjusted"),
        (lambda r: r["paired_tests"], "p_value", "p_adjusted"),
        (lambda r: r["paired_tests"], "wilcoxon_p", "wilcoxon_p_adjusted"),
        (lambda r: (r["paired_tests"] or {}).get("mcnemar"), "p_value", "p_adjusted"),
    ]
    for r in records:
        r["adjust"] = method
    for get, src, dst in families:
        holders = [h for h in (get(r) for r in records) if h is not None]
        adjusted = stats.adjust([h[src] for h in holders], method)
        for h, p in zip(holders, adjusted, strict=True):
            h[dst] = p
