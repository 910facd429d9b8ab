"""Running dphil's installed commands as real processes, and what tests need from the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dphil.io.console_scripts import locate

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def load_script(relative: str) -> Any:
    """A script of the repository that is not a package module (man/generate.py, bench/...), imported."""
    import importlib.util

    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_path(name: str) -> str:
    """The installed console script `name` (from the same environment as the tests)."""
    found = locate(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `pip install -e .` first")
    return found


def run(
    args: list[str],
    *,
    input: bytes | None = None,
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run an installed dphil command as a real subprocess."""
    # No input: an empty stdin, not the test runner's (whatever CI connected it to).
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(
        [command_path(args[0]), *args[1:]], **stdin, capture_output=True, cwd=cwd, env=env, timeout=timeout
    )


# A short system prompt keeps every forward pass small on a CPU (the train tests' `prompt_file`).
PROMPT = "Philosopher $seat of $n. Forks $left_fork and $right_fork.\n$answer\n"


def need_system_part(available: bool, what: str) -> None:
    """Skip a test whose system part (Slurm, Chromium, a real model) is missing, or fail under CI.

    `.ci/setup` installs every part; a CI run that skipped them would pass without testing them.
    """
    if available:
        return
    message = f"{what} is not available here (install it with `bash .ci/setup`)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def real_model_installed() -> bool:
    """Whether the `real` extra (Gemma 3 270M's chunk packages, gguf) and the train stack are here."""
    from importlib.util import find_spec

    from dphil.serving.weights import CHUNKS

    needed = [package for package, _ in CHUNKS] + ["gguf", "torch", "transformers"]
    return all(find_spec(name) is not None for name in needed)


def keep_picture(png: bytes | Path, name: str) -> None:
    """With DPHIL_SCREENSHOTS=DIR, keep a test's picture for the README (64 colours: small files).

    The README's pictures are the tests' own renderings: `DPHIL_SCREENSHOTS=docs/img pytest ...`.
    """
    target = os.environ.get("DPHIL_SCREENSHOTS")
    if not target:
        return
    import io

    from PIL import Image

    Path(target).mkdir(parents=True, exist_ok=True)
    data = png.read_bytes() if isinstance(png, Path) else png
    with Image.open(io.BytesIO(data)) as im:
        im.convert("RGB").quantize(colors=64).save(Path(target) / name, optimize=True)
