"""The committed man pages and docs/cli.md are exactly what man/generate.py makes of the current commands."""

from __future__ import annotations

from tests.support.commands import ROOT, load_script


def _generator():
    return load_script("man/generate.py")


def test_man_pages_match_the_commands(tmp_path):
    fresh = _generator().generate(tmp_path)
    assert fresh
    for page in fresh:
        committed = ROOT / "man" / page.name
        assert committed.exists(), f"man/{page.name} missing: run python man/generate.py"
        assert committed.read_text() == page.read_text(), f"man/{page.name} is out of date: run python man/generate.py"


def test_cli_reference_matches_the_commands():
    module = _generator()
    committed = ROOT / "docs" / "cli.md"
    assert committed.exists(), "docs/cli.md missing: run python man/generate.py"
    assert committed.read_text() == module.cli_reference(), "docs/cli.md is out of date: run python man/generate.py"


def test_cli_reference_has_every_command_in_order():
    module = _generator()
    text = module.cli_reference()
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert headings == list(module.COMMANDS)
    for name in module.COMMANDS:
        assert f"Usage: {name} " in text


def test_every_man_page_is_installed_with_the_package():
    """`pip install .` puts them in the environment's share/man/man1, where `man NAME` finds them."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = sorted(cfg["options.data_files"]["share/man/man1"].split())
    assert listed == sorted(f"man/{p.name}" for p in (ROOT / "man").glob("*.1"))
