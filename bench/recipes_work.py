"""The recipe experiment's work files: written whole, and read only as far as they are complete.

What lets bench/recipes.py stop and carry on: a file it writes appears whole or not at all, and
what another command was writing when it stopped (a training journal, a rollout journal) counts
only up to its last whole record.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Write beside the target, then rename: a stopped experiment leaves the old file or the new."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def journal(run_dir: Path) -> list[dict]:
    """A training run's committed checkpoint records (a torn last line is not one): its steps done."""
    path = run_dir / "checkpoints.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip() and line.endswith("}")]


def complete_lines(path: Path) -> int:
    """How many complete episodes a rollout journal holds (a torn or errored line counts for none)."""
    if not path.exists():
        return 0
    n = 0
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            n += json.loads(line).get("status") == "complete"
    return n
