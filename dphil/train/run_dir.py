"""The run directory, which makes a training run resumable.

`run.json` holds the settings that must not change between invocations,
`checkpoints.jsonl` is the journal (a step is done when its record is in it),
`steps/NNNN/` the adapters. A resumed run starts after the journal's last step,
and an `--episodes-out` file is trimmed to the episodes of committed steps.

A run directory may be moved or copied: nothing in it depends on where it is.
`run.json` holds a `run_id` (random, made when the run starts) that every
checkpoint record repeats, with the adapter's place inside the directory
(`path_in_run`); a resume continues from `steps/NNNN` of the directory it was
given, never from a path the journal names, and refuses a journal whose records
carry another run's id (a DataError, exit 65: the files disagree, not the
options). Runs from before run ids get one at their first resume.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from dphil import __version__
from dphil.checkpoints.record import RUN_SETTINGS
from dphil.io.atomic import atomic_file
from dphil.io.errors import DataError, UsageError
from dphil.train.advantages import AdvantageSpec

if TYPE_CHECKING:
    from dphil.train.loop import TrainConfig

JOURNAL = "checkpoints.jsonl"
SETTINGS = RUN_SETTINGS  # "run.json"
STEPS_DIR = "steps"


def load_journal(run_dir: Path) -> list[dict[str, Any]]:
    """Checkpoint records already committed (a torn last line, from a kill, is dropped).

    Every record that has a `run_id` must have this directory's (from run.json): a
    journal holding another run's records is a DataError naming the line (exit 65).
    """
    path = run_dir / JOURNAL
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    records = []
    own_id = _settings_run_id(run_dir)
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise DataError("invalid JSON in the run journal", source=str(path), line=lineno) from None
        if not isinstance(rec, dict) or rec.get("kind") != "checkpoint" or type(rec.get("step")) is not int:
            raise DataError("not a checkpoint record", source=str(path), line=lineno)
        rec_id = rec.get("run_id")
        if rec_id is not None and rec_id != own_id:
            mine = f"run_id {own_id}" if own_id else "no run_id"
            theirs = repr(rec_id) if len(repr(rec_id)) <= 40 else repr(rec_id)[:37] + "..."
            raise DataError(
                f"step {rec['step']} belongs to run_id {theirs}, but {run_dir / SETTINGS} has {mine}: "
                "the journal holds another run's records; refusing to resume from them (use a new --run-dir)",
                source=str(path),
                line=lineno,
            )
        records.append(rec)
    steps = [r["step"] for r in records]
    if steps != list(range(1, len(steps) + 1)):
        raise DataError(f"the journal's steps are not 1..{len(steps)}: {steps}", source=str(path))
    return records


def _settings_run_id(run_dir: Path) -> str | None:
    """run.json's run_id; None when there is no run.json or it predates run ids."""
    path = run_dir / SETTINGS
    if not path.exists():
        return None
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read the run settings: {e}", source=str(path)) from None
    value = old.get("run_id") if isinstance(old, dict) else None
    if value is not None and (not isinstance(value, str) or not value):
        raise DataError(f"'run_id' should be a non-empty string, got {value!r}", source=str(path))
    return value


def recorded_run_name(run_dir: Path) -> str | None:
    """The run name in run.json (kept when the directory is moved or renamed); None for a new run."""
    try:
        old = json.loads((run_dir / SETTINGS).read_text())
    except (OSError, ValueError):
        return None  # check_settings reports an unreadable run.json
    name = old.get("run") if isinstance(old, dict) else None
    return name if isinstance(name, str) and name else None


def check_settings(cfg: TrainConfig) -> str:
    """Write run.json on a fresh run; on a resumed one, refuse changed settings. Return the run_id.

    A run.json from before run ids gets one added (its other fields are kept).
    """
    path = cfg.run_dir / SETTINGS
    ident = json.loads(json.dumps(cfg.identity()))
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read the run settings: {e}", source=str(path)) from None
        # Runs from before --advantage existed trained with episode advantages.
        old.setdefault("advantage", AdvantageSpec().as_record())
        changed = [k for k in ident if old.get(k) != ident[k]]
        if changed:
            k = changed[0]
            raise UsageError(
                f"--run-dir {cfg.run_dir} was started with {k} = {json.dumps(old.get(k))}, not "
                f"{json.dumps(ident[k])}; resume with the same settings or use a new --run-dir"
            )
        run_id = _settings_run_id(cfg.run_dir)
        if run_id is None:
            run_id = new_run_id()
            with atomic_file(path) as fh:
                fh.write((json.dumps({**json.loads(path.read_text()), "run_id": run_id}, indent=2) + "\n").encode())
        return run_id
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id()
    settings = {**ident, "run": cfg.run, "run_id": run_id, "dphil_version": __version__}
    with atomic_file(path) as fh:
        fh.write((json.dumps(settings, indent=2) + "\n").encode())
    return run_id


def new_run_id() -> str:
    """A run's identity: random, so two runs never share one, even started from the same command."""
    return uuid.uuid4().hex


def resume_adapter(run_dir: Path, record: dict[str, Any]) -> str:
    """The adapter (and optimiser state) a resume continues from: inside `run_dir`, wherever it now is.

    `path_in_run` when the record has it (any backend); for records from before it, a
    peft step's `steps/NNNN` of this directory, else (an ART checkpoint outside the run
    directory) the recorded `path`.
    """
    inner = record.get("path_in_run")
    if isinstance(inner, str) and inner and not os.path.isabs(inner) and ".." not in Path(inner).parts:
        return str(run_dir / inner)
    if record.get("backend", "peft") == "peft" or not isinstance(record.get("path"), str):
        return str(step_dir(run_dir, record["step"]))
    return str(record["path"])


def path_in_run(run_dir: Path, adapter: str) -> str | None:
    """`adapter` relative to `run_dir` (POSIX separators), or None when it lies outside it."""
    rel = os.path.relpath(os.path.abspath(adapter), os.path.abspath(run_dir))
    if rel == os.curdir or rel.split(os.sep)[0] == os.pardir or os.path.isabs(rel):
        return None
    return Path(rel).as_posix()


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / STEPS_DIR / f"{step:04d}"


def _append_journal(run_dir: Path, record: dict[str, Any]) -> None:
    fd = os.open(run_dir / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        os.fsync(fd)
    finally:
        os.close(fd)


def trim_episodes(path: str, last_step: int) -> None:
    """Keep in an --episodes-out file only episodes of committed steps (no duplicates on resume)."""
    if not os.path.exists(path):
        return
    keep = []
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # torn by a kill
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(rec, dict) and _written_at(rec) <= last_step:
                keep.append(line)
    with atomic_file(path) as fh:
        fh.writelines(keep)


def _written_at(rec: dict[str, Any]) -> int:
    step = rec.get("train_step") if rec.get("split") == "train" else rec.get("checkpoint_step")
    return step if isinstance(step, int) else 1 << 30
