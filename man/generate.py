"""Generate man/*.1 from the click commands with click-man.

Run `python man/generate.py` after changing any command's options;
tests/test_man.py fails when the committed pages drift from the commands.
The date is fixed to the package version's, so regenerating is reproducible.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from click_man.core import write_man_pages

from dphil import __version__

COMMANDS = {
    "dphil-rollout": "dphil.commands.rollout",
    "dphil-score": "dphil.commands.score",
    "dphil-train": "dphil.commands.train",
    "dphil-ckpt-select": "dphil.commands.ckpt_select",
    "dphil-stats": "dphil.commands.stats",
    "dphil-weights": "dphil.commands.weights",
    "dphil-show": "dphil.commands.show",
}
DATE = "2026-12-02"


def generate(target: Path) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, module in COMMANDS.items():
        cli = importlib.import_module(module).main
        write_man_pages(name, cli, version=__version__, target_dir=str(target), date=DATE)
        written.append(target / f"{name}.1")
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    for path in generate(out):
        print(path)
