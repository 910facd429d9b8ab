"""`dphil-train --tensorboard`: each checkpoint record's numbers as TensorBoard scalars.

The checkpoint record is the one account of a step; this module only copies
its numbers into event files (through `torch.utils.tensorboard`, which needs
the `tensorboard` package) so that `tensorboard --logdir runs/` draws the run
while it trains. The tag names and the record fields they come from are the
table below; a field that a step does not have (validation between
`--val-every` steps, a backend without a KL term) is left out of that step.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from dphil.io.errors import MissingExtraError

# TensorBoard tag -> checkpoint record field.
SCALARS: dict[str, str] = {
    "train/reward": "train_reward",
    "train/reward_std": "train_reward_std",
    "train/meals": "train_meals_mean",
    "train/deadlock_rate": "train_deadlock_rate",
    "train/zero_std_groups": "zero_std_groups",
    "train/errors": "train_errors",
    "val/reward": "val_reward",
    "val/reward_std": "val_reward_std",
    "val/meals": "val_meals_mean",
    "val/deadlock_rate": "val_deadlock_rate",
    "val/errors": "val_errors",
    "loss/loss": "loss",
    "loss/pg_loss": "pg_loss",
    "loss/kl": "kl",
    "loss/clip_fraction": "clip_fraction",
    "loss/grad_norm": "grad_norm",
    "optim/learning_rate": "learning_rate",
    "time/seconds_per_step": "seconds",
}


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The tags and values one checkpoint record contributes (numbers only, None left out)."""
    out: dict[str, float] = {}
    for tag, name in SCALARS.items():
        value = record.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[tag] = float(value)
    by_n = record.get("val_reward_by_n")
    if isinstance(by_n, dict):
        for n, value in by_n.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[f"val/reward_n{n}"] = float(value)
    return out


def check_available() -> None:
    """Refuse `--tensorboard` before any model loads when its package is missing (exit 69)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise MissingExtraError(
            "--tensorboard needs the tensorboard package: pip install 'dphil[train]' (or pip install tensorboard)"
        )


class TensorBoardLog:
    """Event files in the run directory, one scalar per tag and step.

    The journal is the account of the run, so a resumed run first writes the
    committed steps again (`journal`) and tells TensorBoard to drop every
    earlier event (`purge_step=1`): a step whose events a kill cut off, or a
    run started without `--tensorboard`, still shows in full, and none shows
    twice. The event file is opened at the first new step, so a run refused
    before it trains (changed settings, nothing left to do) leaves none behind.
    """

    def __init__(self, directory: Path, journal: list[dict[str, Any]] | None = None) -> None:
        check_available()
        self.directory = directory
        self._journal = list(journal or [])
        self._writer: Any = None

    def write(self, record: dict[str, Any]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.directory), purge_step=1 if self._journal else None)
            for old in self._journal:
                self._add(old)
        self._add(record)
        self._writer.flush()

    def _add(self, record: dict[str, Any]) -> None:
        step = record["step"]
        for tag, value in scalars(record).items():
            self._writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
