"""A researcher's first hour: versions, directories made, one-line usage errors, no lost stdin, fast failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dphil import __version__
from tests.scoring.test_score_terminal import on_a_terminal
from tests.support.commands import command_path, run
from tests.test_smoke import COMMANDS


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_says_its_version(name):
    p = run([name, "--version"])
    assert p.returncode == 0 and p.stdout.decode() == f"{name} {__version__}\n"


def test_records_carry_the_version_that_wrote_them():
    p = run(["dphil-rollout", "-m", "scripted:naive", "-n", "3", "--episodes", "1"])
    assert json.loads(p.stdout)["dphil_version"] == __version__


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["dphil-rollout", "-m", "scripted:naive", "--episodes", "-1"], "--episodes"),
        (["dphil-rollout", "-m", "scripted:naive", "-n", "0"], "-n"),
        (["dphil-stats", "--nope"], "--nope"),
        (["dphil-score", "--reward", "best"], "--reward"),
        (["dphil-rollout", "-m", "scripted:naive", "--episodes", "2", "--seeds", "1-3"], "--seeds"),
        (["dphil-rollout", "-m", "scripted:naive", "--seed", "4", "--seeds", "1-3"], "--seeds"),
    ],
)
def test_usage_errors_are_one_line_and_exit_64(args, says):
    p = run(args)
    err = p.stderr.decode()
    assert p.returncode == 64, err
    assert err.count("\n") == 1 and err.startswith(f"{args[0]}: ") and says in err
    assert "Usage:" not in err


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["dphil-rollout", "-m", "scripted:naive", "-n", "3"], "--checkpoints -"),
        (["dphil-weights", "--gguf-only"], ""),
        (["dphil-train", "--base-model", "x", "--run-dir", "r"], ""),
    ],
)
def test_records_piped_into_a_command_that_reads_none_are_refused(args, hint):
    p = run(args, input=b'{"kind": "episode"}\n')
    err = p.stderr.decode()
    assert p.returncode == 64 and "records are piped into stdin" in err and hint in err
    assert p.stdout == b""


def test_outputs_get_their_directories(tmp_path):
    out = tmp_path / "runs" / "a" / "ep.jsonl"
    p = run(["dphil-rollout", "-m", "scripted:naive", "-n", "3", "--episodes", "2", "-o", str(out)])
    assert p.returncode == 0, p.stderr
    assert len(out.read_text().splitlines()) == 2
    scored = tmp_path / "scored" / "ep.jsonl"
    assert run(["dphil-score", str(out), "-o", str(scored)]).returncode == 0
    stats = tmp_path / "reports" / "cells.jsonl"
    assert run(["dphil-stats", str(scored), "-o", str(stats)]).returncode == 0
    assert json.loads(stats.read_text().splitlines()[0])["episodes"] == 2


def test_train_run_dir_gets_its_parents(tmp_path, tiny, prompt_file):
    from tests.train.test_train_cli import base_args

    run_dir = tmp_path / "runs" / "q14"
    args = base_args(tiny, prompt_file, run_dir, "--steps", "1", "--groups", "1", "--rounds", "1")
    p = run(["dphil-train", *args], timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    assert (run_dir / "run.json").exists()


def test_a_missing_input_fails_before_the_statistics_stack_loads(tmp_path):
    probe = (
        "import sys\n"
        "from dphil.commands.stats import main\n"
        f"code = main([{str(tmp_path / 'none.jsonl')!r}], standalone_mode=False)\n"
        "heavy = sorted(m for m in ('scipy', 'scipy.stats', 'polars.io', 'numpy.linalg') if m in sys.modules)\n"
        "print(code, heavy)\n"
    )
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert p.stdout.split(" ", 1)[0] == "66", p.stdout + p.stderr
    assert "'scipy" not in p.stdout, p.stdout
    assert "no such file" in p.stderr


def test_a_terminal_is_told_where_the_episodes_went(tmp_path):
    out = tmp_path / "ep.jsonl"
    args = [command_path("dphil-rollout"), "-m", "scripted:naive", "-n", "3", "--episodes", "2", "-o", str(out)]
    code, _, shown = on_a_terminal(args, b"")
    assert code == 0
    assert shown.splitlines()[-1] == f"dphil-rollout: wrote 2 episode(s) to {out}"


def test_an_unknown_grouping_field_is_a_usage_error(tmp_path):
    p = run(["dphil-rollout", "-m", "scripted:naive", "-n", "3", "--episodes", "2"])
    scored = run(["dphil-score"], input=p.stdout).stdout
    bad = run(["dphil-stats", "-", "--by", "modle"], input=scored)
    assert bad.returncode == 64 and bad.stderr.decode().startswith("dphil-stats: no episode has a field 'modle'")
    assert run(["dphil-stats", "-", "--by", "deadlock_round"], input=scored).returncode == 0
    unknown = run(["dphil-show", "-", "--episode", "nope"], input=scored)
    assert unknown.returncode == 65 and unknown.stderr.count(b"\n") == 1


def test_stats_and_show_tell_a_terminal_where_they_wrote(tmp_path):
    p = run(["dphil-rollout", "-m", "scripted:naive", "-n", "3", "--episodes", "2"])
    scored = tmp_path / "ep.jsonl"
    scored.write_bytes(run(["dphil-score"], input=p.stdout).stdout)
    cells = tmp_path / "cells.jsonl"
    code, _, shown = on_a_terminal([command_path("dphil-stats"), str(scored), "-o", str(cells)], b"")
    assert code == 0 and shown.splitlines()[-1] == f"dphil-stats: wrote 1 cell(s) and 0 comparison(s) to {cells}"
    page = tmp_path / "ep.html"
    code, _, shown = on_a_terminal([command_path("dphil-show"), str(scored), "-o", str(page)], b"")
    assert code == 0 and shown.splitlines()[-1] == f"dphil-show: wrote html to {page}"
