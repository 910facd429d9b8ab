"""The committed man pages are exactly what click-man makes of the current commands."""

from __future__ import annotations

import importlib.util

from tests.support.commands import ROOT


def test_man_pages_match_the_commands(tmp_path):
    spec = importlib.util.spec_from_file_location("man_generate", ROOT / "man" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fresh = module.generate(tmp_path)
    assert fresh
    for page in fresh:
        committed = ROOT / "man" / page.name
        assert committed.exists(), f"man/{page.name} missing: run python man/generate.py"
        assert committed.read_text() == page.read_text(), f"man/{page.name} is out of date: run python man/generate.py"
