"""Every command is one typed request and one library call: the click layer only parses options.

Run with no options beyond the required ones, each command hands its library the
request's own defaults, so the library's defaults and the command line's cannot drift.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from click.testing import CliRunner

from dphil.checkpoints.request import SelectRequest
from dphil.results.request import StatsRequest
from dphil.scoring.request import RewardRequest, ScoreRequest
from dphil.serving.request import WeightsRequest
from dphil.train.launch import TrainRequest

CASES = [
    ("score", "dphil.scoring.request", "run_score", [], ScoreRequest()),
    ("stats", "dphil.results.request", "run_stats", [], StatsRequest()),
    ("ckpt_select", "dphil.checkpoints.request", "run_select", [], SelectRequest()),
    ("weights", "dphil.serving.request", "run_weights", [], WeightsRequest()),
    ("train", "dphil.train.launch", "launch", ["--base-model", "m", "--run-dir", "r"], TrainRequest("m", "r")),
]


@pytest.mark.parametrize("command,module,function,args,expected", CASES, ids=[c[0] for c in CASES])
def test_the_command_hands_over_the_request_defaults(monkeypatch, tmp_path, command, module, function, args, expected):
    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module(module), function, lambda req, console: seen.append(req) or 0)
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"dphil.commands.{command}").main
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert seen == [expected]


def test_reward_options_arrive_as_one_request(monkeypatch):
    seen: list[Any] = []
    monkeypatch.setattr("dphil.scoring.request.run_score", lambda req, console: seen.append(req) or 0)
    from dphil.commands.score import main

    args = ["--shaped", "--alpha", "2", "--delta", "0.5", "--min-meals", "3", "a.jsonl"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert seen[0].reward == RewardRequest(shaped=True, alpha=2.0, delta=0.5, min_meals=3)
    assert seen[0].inputs == ("a.jsonl",)


def test_train_and_rollout_offer_the_same_prompts_and_train_the_advantage_modes():
    import click
    from dphil.commands.rollout import main as rollout
    from dphil.commands.train import main as train

    from dphil.agents.prompts import BUILTIN_TEMPLATES
    from dphil.train.advantages import MODES

    def choices(cmd: click.Command, name: str) -> list[str]:
        (param,) = [p for p in cmd.params if p.name == name]
        assert isinstance(param.type, click.Choice)
        return list(param.type.choices)

    assert choices(rollout, "prompt") == choices(train, "prompt") == list(BUILTIN_TEMPLATES)
    assert choices(train, "advantage") == list(MODES)


@pytest.mark.parametrize("bad", [["--shaped", "--reward", "paper"], ["--alpha", "nan"]])
def test_reward_checks_are_the_same_in_score_and_train(tmp_path, bad):
    from dphil.commands.score import main as score
    from dphil.commands.train import main as train

    scored = CliRunner().invoke(score, [*bad, str(tmp_path / "none.jsonl")])
    trained = CliRunner().invoke(train, ["--base-model", "m", "--run-dir", str(tmp_path / "r"), *bad])
    assert scored.exit_code == trained.exit_code == 64
    assert scored.stderr.split(": ", 1)[1] == trained.stderr.split(": ", 1)[1]
