"""The run directory, which makes a training run resumable.

`run.json` holds the settings that must not change between invocations,
`checkpoints.jsonl` is the journal (a step is done when its record is in it),
`steps/NNNN/` the adapters. A resumed run starts after the journal's last step,
and an `--episodes-out` file is trimmed to the episodes of committed steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from dphil import __version__
from dphil.io.atomic import atomic_file
from dphil.io.errors import DataError, UsageError
from dphil.train.advantages import AdvantageSpec

if TYPE_CHECKING:
    from dphil.train.loop import TrainConfig

JOURNAL = "checkpoints.jsonl"
SETTINGS = "run.json"
STEPS_DIR = "steps"


def load_journal(run_dir: Path) -> list[dict[str, Any]]:
    """Checkpoint records already committed (a torn last line, from a kill, is dropped)."""
    path = run_dir / JOURNAL
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    records = []
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise DataError("invalid JSON in the run journal", source=str(path), line=lineno) from None
        if not isinstance(rec, dict) or rec.get("kind") != "checkpoint" or type(rec.get("step")) is not int:
            raise DataError("not a checkpoint record", source=str(path), line=lineno)
        records.append(rec)
    steps = [r["step"] for r in records]
    if steps != list(range(1, len(steps) + 1)):
        raise DataError(f"the journal's steps are not 1..{len(steps)}: {steps}", source=str(path))
    return records


def check_settings(cfg: TrainConfig) -> None:
    """Write run.json on a fresh run; on a resumed one, refuse changed settings."""
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
        return
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as fh:
        fh.write((json.dumps({**ident, "run": cfg.run, "dphil_version": __version__}, indent=2) + "\n").encode())


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
