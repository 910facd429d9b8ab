"""A quick check of an install: every command starts, and the pipeline runs end to end.

`python -m pytest -p no:cacheprovider -m smoke` runs this file (and nothing else) in well
under three minutes on two cores; the whole suite stays in CI. It runs the installed
commands as real processes through real pipes, as a user would.
"""

from __future__ import annotations

import json
import subprocess
from importlib.util import find_spec

import pytest

from tests.support.commands import command_path, run

pytestmark = pytest.mark.smoke

COMMANDS = [
    "dphil-rollout",
    "dphil-score",
    "dphil-stats",
    "dphil-train",
    "dphil-ckpt-select",
    "dphil-show",
    "dphil-weights",
]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_starts(name):
    p = run([name, "--help"])
    assert p.returncode == 0, p.stderr.decode()
    assert b"Usage:" in p.stdout


def test_the_scripted_pipeline_runs_end_to_end(tmp_path):
    rollout = subprocess.Popen(
        [
            command_path("dphil-rollout"),
            "-m",
            "scripted:naive",
            "-m",
            "scripted:hierarchy",
            "-m",
            "scripted:idle",
            "-n",
            "5",
            "--episodes",
            "3",
        ],
        stdout=subprocess.PIPE,
    )
    score = subprocess.run([command_path("dphil-score"), "--shaped"], stdin=rollout.stdout, capture_output=True)
    rollout.stdout.close()
    assert rollout.wait() == 0 and score.returncode == 0, score.stderr.decode()
    episodes = [json.loads(line) for line in score.stdout.splitlines()]
    assert len(episodes) == 9
    by_model = {}
    for e in episodes:
        by_model.setdefault(e["model"], []).append(e)
    assert all(e["deadlock"] for e in by_model["scripted:naive"])
    assert not any(e["deadlock"] for e in by_model["scripted:hierarchy"])
    # The degenerate table: nobody acts. Shaped, it scores -delta (the published reward pays 1.0).
    assert {e["reward"]["total"] for e in by_model["scripted:idle"]} == {-0.1}

    scored = tmp_path / "ep.jsonl"
    scored.write_bytes(score.stdout)
    stats = run(["dphil-stats", str(scored), "--format", "jsonl"])
    assert stats.returncode == 0, stats.stderr.decode()
    cells = [json.loads(line) for line in stats.stdout.splitlines()]
    assert {c["model"] for c in cells if c.get("kind") == "cell"} == set(by_model)

    paper = run(["dphil-score", str(scored)])
    assert paper.returncode == 0
    idle = [json.loads(x) for x in paper.stdout.splitlines() if b"scripted:idle" in x]
    assert {e["reward"]["total"] for e in idle} == {1.0}

    shown = run(["dphil-show", str(scored), "--episode", "0", "--format", "text"])
    assert shown.returncode == 0, shown.stderr.decode()
    assert b"scripted:naive" in shown.stdout


@pytest.mark.skipif(find_spec("torch") is None or find_spec("peft") is None, reason="the train extra is not installed")
def test_one_training_step_on_a_tiny_model(tmp_path, tiny, prompt_file):
    from tests.train.test_train_cli import base_args

    args = base_args(tiny, prompt_file, tmp_path / "run", "--steps", "1", "--groups", "1", "--rounds", "1")
    p = run(["dphil-train", *args], timeout=170)
    assert p.returncode == 0, p.stderr.decode()
    checkpoints = [json.loads(line) for line in p.stdout.splitlines()]
    assert [c["step"] for c in checkpoints if c.get("kind") == "checkpoint"] == [1]
