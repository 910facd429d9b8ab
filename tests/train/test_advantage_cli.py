"""`dphil-train --advantage`: options, records, resume, and per-turn advantages reaching peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from dphil.commands.train import main

from tests.train.test_train_cli import base_args, invoke

pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--advantage", "team"], "--advantage"),
        (["--advantage", "step", "--advantage-gamma", "1.5"], "--advantage-gamma"),
        (["--advantage", "step", "--advantage-weight", "-1"], "--advantage-weight"),
        (["--advantage", "step", "--advantage-weight", "inf"], "weight"),
        (["--advantage", "philosopher", "--advantage-gamma", "0.9"], "only to --advantage step"),
        (["--advantage-weight", "0.5"], "only to --advantage step"),
        (["--advantage", "counterfactual", "--advantage-gamma", "0.9"], "only to --advantage step or agent-turn"),
        (["--advantage", "agent-turn", "--advantage-weight", "0.5"], "only to --advantage step, not agent-turn"),
    ],
)
def test_bad_advantage_options_exit_64_before_loading_a_model(tmp_path, extra, match):
    args = ["--base-model", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "r"), *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 64, result.output
    assert match in result.stderr


def test_step_mode_is_recorded_in_every_checkpoint_and_the_run_settings(tiny, prompt_file, tmp_path):
    run_dir = tmp_path / "run"
    args = base_args(
        tiny,
        prompt_file,
        run_dir,
        "--steps",
        "2",
        "--rounds",
        "3",
        "--advantage",
        "step",
        "--advantage-gamma",
        "0.9",
        "--advantage-weight",
        "0.5",
    )
    result, records = invoke(args)
    assert result.exit_code == 0, result.stderr
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "checkpoint.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema).validate
    for r in records:
        assert r["advantage"] == {"mode": "step", "gamma": 0.9, "weight": 0.5, "blame": "hold-and-wait"}
        # Round 1 is the same state for every seat of every episode of a group: a step group each.
        assert r["advantage_groups"] >= 2 * 3
        assert 0 <= r["advantage_tied_groups"] <= r["advantage_groups"]
        assert r["trained_samples"] > 0
        # How the step computed, with each checkpoint: the defaults on a CPU.
        assert r["arithmetic"] == {
            "device": "cpu",
            "dtype": "float32",
            "autocast": None,
            "gradient_checkpointing": True,
            "pack_width": 2048,
            "shared_prefix": True,
        }
        validator(r)
    settings = json.loads((run_dir / "run.json").read_text())
    assert settings["advantage"] == {"mode": "step", "gamma": 0.9, "weight": 0.5, "blame": "hold-and-wait"}
    # Resuming under another credit assignment is refused, naming it.
    bad, recs = invoke(
        base_args(tiny, prompt_file, run_dir, "--steps", "3", "--rounds", "3", "--advantage", "philosopher")
    )
    assert bad.exit_code == 64 and recs == [] and "advantage" in bad.stderr


def test_philosopher_mode_and_the_default(tiny, prompt_file, tmp_path):
    result, records = invoke(base_args(tiny, prompt_file, tmp_path / "p", "--steps", "1", "--advantage", "philosopher"))
    assert result.exit_code == 0, result.stderr
    assert records[0]["advantage"] == {"mode": "philosopher", "blame": "hold-and-wait"}
    assert records[0]["advantage_groups"] == 2 * 3  # groups x seats
    result, records = invoke(base_args(tiny, prompt_file, tmp_path / "e", "--steps", "1"))
    assert records[0]["advantage"] == {"mode": "episode"}
    assert records[0]["advantage_groups"] == 2
    assert records[0]["advantage_tied_groups"] == records[0]["zero_std_groups"]


@pytest.mark.parametrize(
    "extra,recorded",
    [
        (
            ["--advantage", "agent-turn", "--advantage-gamma", "0.9"],
            {"mode": "agent-turn", "gamma": 0.9, "blame": "hold-and-wait"},
        ),
        (["--advantage", "counterfactual"], {"mode": "counterfactual"}),
    ],
)
def test_the_new_modes_train_and_are_recorded(tiny, prompt_file, tmp_path, extra, recorded):
    import jsonschema

    run_dir = tmp_path / "run"
    result, records = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "1", "--rounds", "2", *extra))
    assert result.exit_code == 0, result.stderr
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "checkpoint.schema.json").read_text())
    for r in records:
        assert r["advantage"] == recorded
        assert 0 <= r["advantage_tied_groups"] <= r["advantage_groups"]
        jsonschema.Draft202012Validator(schema).validate(r)
    assert json.loads((run_dir / "run.json").read_text())["advantage"] == recorded


def test_a_run_from_before_advantages_resumes_as_episode(tiny, prompt_file, tmp_path):
    run_dir = tmp_path / "old"
    ok, _ = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "1"))
    assert ok.exit_code == 0
    settings = json.loads((run_dir / "run.json").read_text())
    del settings["advantage"]  # as dphil-train wrote it before --advantage
    (run_dir / "run.json").write_text(json.dumps(settings))
    again, recs = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "2"))
    assert again.exit_code == 0, again.stderr
    assert [r["step"] for r in recs] == [2]
    bad, _ = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "3", "--advantage", "step"))
    assert bad.exit_code == 64


def test_a_run_under_the_old_blame_rule_refuses_to_resume(tiny, prompt_file, tmp_path):
    """A philosopher run recorded before the blame rule was named trained under the old rule."""
    run_dir = tmp_path / "old-blame"
    ok, _ = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "1", "--advantage", "philosopher"))
    assert ok.exit_code == 0, ok.stderr
    settings = json.loads((run_dir / "run.json").read_text())
    assert settings["advantage"] == {"mode": "philosopher", "blame": "hold-and-wait"}
    settings["advantage"] = {"mode": "philosopher"}  # as dphil-train wrote it under the old rule
    (run_dir / "run.json").write_text(json.dumps(settings))
    bad, recs = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "2", "--advantage", "philosopher"))
    assert bad.exit_code == 64 and recs == []
    assert "advantage" in bad.stderr and "hold-and-wait" in bad.stderr


def test_peft_trains_on_each_turn_with_its_own_advantage(tiny, prompt_file, tmp_path):
    """Only turns with a non-zero advantage are trained: per-turn advantages reach the backend."""
    from dphil.agents.prompts import get_prompt
    from dphil.core.records import EpisodeConfig
    from dphil.train.loop import ScoredGroup
    from dphil.train.peft_backend import PeftBackend, PeftSettings

    backend = PeftBackend(
        PeftSettings(base_model=str(tiny), prompt=get_prompt("default", str(prompt_file)), memory=0, learning_rate=1e-2)
    )
    configs = [EpisodeConfig(model="hf:t", n=2, rounds=2, seed=5) for _ in range(2)]
    played = backend.rollout(configs, seed=3)
    turns = [len(p.record["turns"]) for p in played]
    assert [len(p.decisions) for p in played] == turns
    advantages = [[0.0] * k for k in turns]
    advantages[0][0] = 1.0
    advantages[1][-1] = -1.0
    group = ScoredGroup(played, [0.0, 0.0], [0.0, 0.0], True, advantages, 1, 0)
    before = {k: v.clone() for k, v in backend.lm.model.named_parameters() if v.requires_grad}
    stats = backend.train_groups([group], step=1)
    assert stats["trained_samples"] == 2.0
    changed = any((v != before[k]).any() for k, v in backend.lm.model.named_parameters() if v.requires_grad)
    assert changed
