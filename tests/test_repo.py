"""Repository rules that keep the project honest: CI runs the README's command, lint, layering."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_import_layers_are_kept():
    """The layers contract in pyproject.toml: stage packages import only downwards (import-linter)."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint_imports), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


MAX_MODULE_LINES = 450  # the guideline is ~400 lines a module; this ceiling leaves a little slack


def test_no_module_is_too_long():
    offenders = [
        f"{p.relative_to(ROOT)}: {lines} lines"
        for package in ("dphil", "commands")
        for p in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert offenders == [], f"over {MAX_MODULE_LINES} lines: split these modules: " + ", ".join(offenders)


def test_mypy_is_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_code_map_names_every_module():
    """docs/architecture.md describes the layout; a module added without a line there fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = [p for d in ("dphil", "commands") for p in (ROOT / d).rglob("*.py") if p.name != "__init__.py"]
    missing = [str(p.relative_to(ROOT)) for p in modules if f"`{p.relative_to(ROOT)}`" not in text]
    assert missing == []
