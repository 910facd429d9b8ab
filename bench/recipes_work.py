"""The recipe experiment's work files: written whole, and read only as far as they are complete.

What lets bench/recipes.py stop and carry on: a file it writes appears whole or not at all, and
what another command was writing when it stopped (a training journal, a rollout journal) counts
only up to its last whole record.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from pathlib import Path


def atomic_write(path: Path, text: str) -> None:
    """Write beside the target, then rename: a stopped experiment leaves the old file or the new."""
    atomic_write_bytes(path, text.encode())


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


# What a later part needs of an earlier one, apart from adapters: the runs' settings and journals,
# the selections, the test episodes, the credit-mode choice and the parts' times. Everything else
# is rebuilt (the tiny model, the scored files) or only needed again to retrain (adapters, the
# training and validation episodes `ep-*.jsonl`, which only a missing selection reads).
KEPT = ("choice.json", "parts.jsonl", "sel-*.jsonl", "test-*.jsonl", "run-*/run.json", "run-*/checkpoints.jsonl")
DERIVED = ("test-all.",)  # scored afresh by every report


def archive(work: Path, dest: Path) -> int:
    """Copy the work files a later part resumes from into `dest`, gzipped, whole lines only.

    The work directory is not committed (adapters are weights); `dest`, beside the results, is.
    A file is rewritten only when its content changed, so an unchanged archive stays unchanged
    in git. Returns how many files changed.
    """
    changed = 0
    for pattern in KEPT:
        for src in sorted(work.glob(pattern)):
            rel_name = src.relative_to(work).as_posix()
            if rel_name.startswith(DERIVED):
                continue
            data = src.read_bytes()
            if src.suffix == ".jsonl" and not data.endswith(b"\n"):
                data = data[: data.rfind(b"\n") + 1]  # a journal's torn last line is not kept
            target = dest / (rel_name + ".gz")
            if target.exists() and gzip.decompress(target.read_bytes()) == data:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, gzip.compress(data, mtime=0))  # mtime 0: same data, same bytes
            changed += 1
    return changed


def restore(src: Path, work: Path) -> list[str]:
    """Fill a fresh work directory (a new machine, a cleaned checkout) from the archive.

    Only a work directory no part has run in (no `parts.jsonl`): in a live one a missing file was
    removed on purpose (a run to train again) and must not come back. Returns the restored names.
    """
    if (work / "parts.jsonl").exists() or not src.is_dir():
        return []
    restored = []
    for path in sorted(src.rglob("*.gz")):
        name = path.relative_to(src).as_posix().removesuffix(".gz")
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, gzip.decompress(path.read_bytes()))
        restored.append(name)
    return restored


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
