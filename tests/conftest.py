"""Shared test helpers: run the installed commands through real processes and pipes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def command_path(name: str) -> str:
    """The installed console script `name` (from the same environment as the tests)."""
    found = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
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
