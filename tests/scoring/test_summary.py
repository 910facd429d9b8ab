"""The one-screen summary of a scored run."""

from __future__ import annotations

import json
import subprocess

from dphil.scoring.summary import Summary
from tests.support.commands import command_path


def scored(*models: str) -> list[dict]:
    args = [command_path("dphil-rollout"), "-n", "5", "--episodes", "4"]
    for m in models:
        args += ["-m", m]
    rollout = subprocess.run(args, capture_output=True, check=True)
    score = subprocess.run([command_path("dphil-score"), "--shaped"], input=rollout.stdout, capture_output=True)
    return [json.loads(x) for x in score.stdout.splitlines()]


def test_summary_counts_per_model_and_n_and_names_the_reward():
    s = Summary()
    for r in scored("scripted:naive", "scripted:hierarchy", "scripted:idle"):
        s.add(r)
    s.add({"kind": "episode", "model": "scripted:naive", "n": 5, "status": "error", "turns": []})
    lines = s.render().splitlines()
    assert lines[0].split() == [
        "model",
        "N",
        "episodes",
        "errors",
        "parsed",
        "meals/ep",
        "deadlock",
        "reward",
        "(shaped)",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["scripted:naive"] == ["5", "5", "1", "100%", "0.00", "100%", "+0.000"]
    assert rows["scripted:idle"][:4] == ["5", "4", "0", "0%"] and rows["scripted:idle"][-1] == "-0.100"
    assert rows["scripted:hierarchy"][5] == "0%"
    assert all(len(line) <= 100 for line in lines)


def test_long_and_hostile_model_names_are_cut_and_shown_safely():
    s = Summary()
    s.add({"model": "x" * 300 + "\x1b[2J", "n": 5, "status": "error"})
    s.add({"model": "evil\x1b]0;t\x07", "n": 5, "status": "error"})
    text = s.render(width=100)
    assert "\x1b" not in text and "\x07" not in text
    assert all(len(line) <= 100 for line in text.splitlines()) and "…" in text
