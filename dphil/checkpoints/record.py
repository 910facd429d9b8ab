"""The checkpoint record, and the inputs of selection read and checked.

`dphil-train` writes one `kind: "checkpoint"` record per step; `dphil-ckpt-select`
reads them together with scored validation episodes tagged with `checkpoint_step`
(in any order, from any number of inputs), and `dphil-rollout --checkpoints` reads
the records alone. This module checks every field those readers rely on and sorts
the records into checkpoints and validation episodes.

Nothing here knows about click; readers hand in `(source, line, record)`
triples so every error can name where the record came from, and so an
adapter can be found from where its record was read (`adapter_path`).

Where an adapter is. `dphil-train` writes `path` (the adapter directory,
absolute as it was when saved), `run_dir` (the run directory, absolute, as
then), `run_id` (the id in that directory's `run.json`) and `path_in_run`
(the adapter directory relative to the run directory). A reader looks for
the run directory, in this order, in the directory of the file the record
was read from (the journal `RUN/checkpoints.jsonl` lies inside it), in the
directory of that name beside the file (`ckpts.jsonl` beside `RUN/`), and
at the recorded `run_dir`; the first whose `run.json` holds the record's
`run_id` is the run directory, and the adapter is `path_in_run` inside it.
For records read from stdin the working directory stands in for the file's
directory. So a run directory moved or copied elsewhere is still found from
its journal, or from a records file kept beside it. When no candidate
matches, or `path` was edited to point elsewhere (it is no longer `run_dir`
joined with `path_in_run`), `path` is used as written. Records without
`run_id` (written before it existed, or by hand) mean `path` as written:
absolute, or relative to the working directory as they always did.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from dphil.core.records import checked_outcome, is_int
from dphil.io.errors import DataError

# Located records: where a record came from, for error messages.
Located = tuple[str, int, dict[str, Any]]

# The settings file of a dphil-train run directory (dphil.train.run_dir), which holds its run_id.
RUN_SETTINGS = "run.json"
# The names a reader gives standard input (dphil.io.jsonl.source_name).
_STDIN = ("-", "<stdin>")

# The record fields selection reads as numbers (null allowed: a step without episodes).
_NUMERIC_FIELDS = tuple(
    f"{prefix}_{name}"
    for prefix in ("train", "val")
    for name in ("reward", "reward_std", "meals_mean", "deadlock_rate", "throughput")
)


@dataclass
class Checkpoint:
    """One saved adapter: its record as read, and the fields selection uses."""

    record: dict[str, Any]
    run: str | None
    step: int
    path: str | None
    where: str
    source: str = "<input>"  # the file the record was read from (or <stdin>): where its run is looked for

    def adapter_path(self) -> str | None:
        """The adapter directory, found from where the record was read (see the module's docstring)."""
        return adapter_path(self.record, self.source)

    @property
    def key(self) -> tuple[str | None, int]:
        return (self.run, self.step)

    def label(self) -> str:
        return f"step {self.step}" if self.run is None else f"run {self.run!r} step {self.step}"


@dataclass
class ValEpisode:
    """What selection needs of one validation episode: its checkpoint and its metric values."""

    run: str | None
    step: int
    where: str
    values: dict[str, float | None]
    reward_key: str | None


@dataclass
class Inputs:
    """Everything read from the inputs, sorted into checkpoints and validation episodes."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    episodes: list[ValEpisode] = field(default_factory=list)
    error_episodes: int = 0
    train_episodes: int = 0


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _where(source: str, line: int) -> str:
    return f"{source}:{line}"


def check_checkpoint(record: dict[str, Any], source: str = "<input>", line: int = 0) -> Checkpoint:
    """Validate a checkpoint record's fields that selection relies on; return it parsed.

    Hand-written records need only `step` (and usually `run`, `path`,
    `train_reward`); every field present must have the right type.
    """
    try:
        if record.get("kind") != "checkpoint":
            raise DataError(f"expected a checkpoint record, got kind {record.get('kind')!r}")
        if "step" not in record:
            raise DataError("checkpoint record is missing field 'step'")
        step = record["step"]
        if not is_int(step) or step < 0:
            raise DataError(f"field 'step' should be a non-negative integer, got {step!r}")
        for name in ("run", "path", "base_model", "backend", "reward_variant", "run_id", "run_dir"):
            value = record.get(name)
            if value is not None and not isinstance(value, str):
                raise DataError(f"field {name!r} should be a string, got {value!r}")
        inner = record.get("path_in_run")
        if inner is not None and not _is_inner_path(inner):
            raise DataError(f"field 'path_in_run' should be a relative path inside the run directory, got {inner!r}")
        rank = record.get("lora_rank")
        if rank is not None and (not is_int(rank) or rank < 1):
            raise DataError(f"field 'lora_rank' should be a positive integer, got {rank!r}")
        for name in _NUMERIC_FIELDS:
            value = record.get(name)
            if value is not None and not _is_number(value):
                raise DataError(f"field {name!r} should be a finite number, got {value!r}")
        for name in ("train_episodes", "val_episodes"):
            value = record.get(name)
            if value is not None and (not is_int(value) or value < 0):
                raise DataError(f"field {name!r} should be a non-negative integer, got {value!r}")
    except DataError as e:
        raise e.at(source, line) from None
    return Checkpoint(record, record.get("run"), step, record.get("path"), _where(source, line), source)


def _is_inner_path(value: Any) -> TypeGuard[str]:
    """A non-empty relative path with no `..`: it cannot leave the run directory."""
    if not isinstance(value, str) or not value or "\x00" in value or os.path.isabs(value):
        return False
    return ".." not in Path(value).parts


def read_run_id(run_dir: str | Path) -> str | None:
    """The `run_id` in `run_dir/run.json`, or None (no such file, unreadable, or a run from before ids)."""
    try:
        with open(Path(run_dir) / RUN_SETTINGS, "rb") as fh:
            settings = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return None
    value = settings.get("run_id") if isinstance(settings, dict) else None
    return value if isinstance(value, str) and value else None


def find_run_dir(record: dict[str, Any], source: str = "<input>") -> Path | None:
    """The run directory of a record that has a `run_id`, found from where it was read; None if not found.

    Candidates, in order: the directory of `source` (the working directory for
    stdin), the directory named like the recorded `run_dir` beside it, and the
    recorded `run_dir`. The first whose run.json holds the record's `run_id` wins.
    """
    run_id = record.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return None
    base = Path(".") if source in _STDIN else Path(source).parent
    candidates = [base]
    recorded = record.get("run_dir")
    if isinstance(recorded, str) and recorded and "\x00" not in recorded:
        name = Path(recorded).name
        if name not in ("", ".", ".."):
            candidates.append(base / name)
        candidates.append(Path(recorded))
    for candidate in candidates:
        if read_run_id(candidate) == run_id:
            return candidate
    return None


def adapter_path(record: dict[str, Any], source: str = "<input>") -> str | None:
    """Where the record's adapter directory is, read from `source` (see the module's docstring).

    `path_in_run` inside the run directory when `find_run_dir` finds it; else
    `path` as written (absolute, or for records from before run ids, relative
    to the working directory). A record whose `path` is no longer its `run_dir`
    joined with its `path_in_run` was edited to point elsewhere, and its `path`
    is taken as written. None when the record names no adapter.
    """
    inner = record.get("path_in_run")
    path = record.get("path")
    path = path if isinstance(path, str) and path else None
    if _is_inner_path(inner) and (path is None or _written_together(path, record.get("run_dir"), inner)):
        run_dir = find_run_dir(record, source)
        if run_dir is not None:
            return os.path.abspath(run_dir / inner)
    return path


def _written_together(path: str, run_dir: Any, inner: str) -> bool:
    """Whether `path` is `run_dir/path_in_run`, as dphil-train writes them (not `path` edited by hand)."""
    if not isinstance(run_dir, str) or "\x00" in run_dir or "\x00" in path:
        return False
    return os.path.normpath(path) == os.path.normpath(os.path.join(run_dir, inner))


def with_adapter_path(checkpoints: Sequence[Checkpoint], record: dict[str, Any]) -> dict[str, Any]:
    """`record` (one of `checkpoints`, maybe with fields added) with `path` set to where its adapter is found.

    The same record may have been read from several sources (the journal and a
    copy of stdout): the first source from which its run directory is found
    decides, else the first source.
    """
    key = (record.get("run"), record.get("step"))
    same = [c for c in checkpoints if c.key == key]
    found = next((c for c in same if find_run_dir(c.record, c.source) is not None), same[0] if same else None)
    path = found.adapter_path() if found is not None else record.get("path")
    return {**record, "path": path}


def _episode_values(record: dict[str, Any]) -> dict[str, float | None]:
    """The four metrics of one episode; reward is None while the episode is unscored."""
    meals, deadlock = checked_outcome(record)
    reward = record.get("reward")
    total = None
    if reward is not None:
        if not isinstance(reward, dict) or not _is_number(reward.get("total")):
            raise DataError("field 'reward.total' should be a finite number")
        total = float(reward["total"])
    metrics = record.get("metrics")
    throughput = metrics.get("throughput_per_round") if isinstance(metrics, dict) else None
    if throughput is None:
        played = record.get("rounds_played")
        if is_int(played):
            throughput = sum(meals) / played if played else 0.0
    elif not _is_number(throughput):
        raise DataError("field 'metrics.throughput_per_round' should be a finite number")
    return {
        "reward": total,
        "meals": float(sum(meals)),
        "deadlock_rate": 1.0 if deadlock else 0.0,
        "throughput": None if throughput is None else float(throughput),
    }


def _reward_key(record: dict[str, Any]) -> str | None:
    """How an episode was scored (variant and weights), so mixed scorings are caught."""
    reward = record.get("reward")
    if not isinstance(reward, dict):
        return None
    weights = reward.get("weights") or {}
    parts = [str(reward.get("variant"))]
    parts += [f"{k}={weights[k]}" for k in sorted(weights)] if isinstance(weights, dict) else []
    if "min_meals" in reward:
        parts.append(f"min_meals={reward['min_meals']}")
    return " ".join(parts)


def read_inputs(items: Iterable[Located]) -> Inputs:
    """Sort located records into checkpoints and validation episodes, checking each.

    Episodes with `status: "error"` carry no outcome and are counted, not used;
    episodes tagged `split: "train"` are training rollouts, not validation, and
    are counted too. Any other kind of record is a data error.
    """
    inputs = Inputs()
    for source, line, record in items:
        kind = record.get("kind", "episode")
        if kind == "checkpoint":
            inputs.checkpoints.append(check_checkpoint(record, source, line))
            continue
        try:
            if kind != "episode":
                raise DataError(f"expected a checkpoint or episode record, got kind {kind!r}")
            if record.get("split") == "train":
                inputs.train_episodes += 1
                continue
            step = record.get("checkpoint_step")
            if step is None:
                raise DataError("episode has no 'checkpoint_step': cannot tell which checkpoint it validates")
            if not is_int(step) or step < 0:
                raise DataError(f"field 'checkpoint_step' should be a non-negative integer, got {step!r}")
            run = record.get("run")
            if run is not None and not isinstance(run, str):
                raise DataError(f"field 'run' should be a string, got {run!r}")
            if record.get("status") == "error":
                inputs.error_episodes += 1
                continue
            values = _episode_values(record)
        except DataError as e:
            raise e.at(source, line) from None
        inputs.episodes.append(ValEpisode(run, step, _where(source, line), values, _reward_key(record)))
    return inputs


def read_checkpoints(items: Iterable[Located], *, run: str | None = None) -> list[Checkpoint]:
    """Read checkpoint records only (what `dphil-rollout --checkpoints` needs), in step order.

    Identical repeats (the same file given twice) collapse to one; two different
    records for the same run and step are a data error naming both lines.
    """
    found: list[Checkpoint] = []
    for source, line, record in items:
        found.append(check_checkpoint(record, source, line))
    checkpoints = _dedupe(found)
    if run is not None:
        checkpoints = [c for c in checkpoints if c.run == run]
    return checkpoints


def located(reader: Any) -> Iterator[Located]:
    """Pair each record of a `dphil.io.jsonl.RecordReader` with its source and line."""
    for record in reader:
        yield reader.source, reader.line, record


def load_checkpoints(sources: Sequence[str], *, run: str | None = None) -> list[Checkpoint]:
    """`read_checkpoints` over files (or `-`), as `dphil-rollout --checkpoints FILE` needs."""
    from dphil.io.jsonl import RecordReader

    return read_checkpoints(located(RecordReader(list(sources))), run=run)


def _dedupe(checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    seen: dict[tuple[str | None, int], Checkpoint] = {}
    runs: dict[str | None, int] = {}
    for c in checkpoints:
        runs.setdefault(c.run, len(runs))
        earlier = seen.get(c.key)
        if earlier is None:
            seen[c.key] = c
        elif _without_selection(earlier.record) != _without_selection(c.record):
            raise DataError(
                f"two different checkpoint records for {c.label()} (also at {earlier.where})", source=c.where
            )
    return sorted(seen.values(), key=lambda c: (runs[c.run], c.step))


def _without_selection(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "selection"}
