"""Repository rules that keep the project honest: CI runs the README's command, lint, layering."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.commands import ROOT


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    command = next(line for line in ci if "pytest" in line and not line.startswith("#"))
    readme = (ROOT / "README.md").read_text()
    assert f"    {command}\n" in readme


def test_library_knows_nothing_of_click():
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "dphil").rglob("*.py")
        if re.search(r"^\s*(import click|from click)", p.read_text(), re.M)
    ]
    assert offenders == []


def test_ruff_is_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_is_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
