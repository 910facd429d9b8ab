"""`dphil-train --backend peft` end to end on the CPU with a tiny Qwen3 model built in the test.

Sizes are minimal (3 philosophers, 2 rounds, 2 groups of 2) so a step takes a
second or two; what is checked is the contract: checkpoint records, adapters
on disk with the requested rank, the episode log, resume, validation and the
curriculum.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from dphil.commands.train import main

from dphil.scoring.reward import RewardSpec
from dphil.scoring.score import score_record
from tests.support.commands import run

pytest.importorskip("torch")
pytest.importorskip("peft")

CHECKPOINT_FIELDS = (
    "run",
    "step",
    "path",
    "base_model",
    "lora_rank",
    "backend",
    "n",
    "reward_variant",
    "train_reward",
    "train_reward_std",
    "train_deadlock_rate",
    "train_meals_mean",
    "zero_std_groups",
)


def base_args(tiny: Path, prompt_file: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "--base-model",
        str(tiny),
        "--run-dir",
        str(run_dir),
        "-n",
        "3",
        "--rounds",
        "2",
        "--groups",
        "2",
        "--group-size",
        "2",
        "--lr",
        "5e-3",
        "--prompt-file",
        str(prompt_file),
        "--memory",
        "none",
        "--seed",
        "7",
        "--threads",
        "1",
        *extra,
    ]


def invoke(args: list[str]):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    records = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return result, records


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def full_run(tiny, prompt_file, tmp_path_factory):
    """Three steps straight through, with validation at steps 2 and 3 and the episode log."""
    d = tmp_path_factory.mktemp("full")
    args = base_args(
        tiny,
        prompt_file,
        d / "run",
        "--steps",
        "3",
        "--val-every",
        "2",
        "--val-seeds",
        "900-901",
        "--episodes-out",
        str(d / "ep.jsonl"),
    )
    result, records = invoke(args)
    assert result.exit_code == 0, result.stderr
    return d, result, records


def test_train_writes_a_checkpoint_record_and_an_adapter_per_step(full_run):
    d, result, records = full_run
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["kind"] == "checkpoint"
        for f in CHECKPOINT_FIELDS:
            assert f in r, f
        assert r["backend"] == "peft" and r["lora_rank"] == 8 and r["n"] == [3]
        assert r["reward_variant"] == "paper"
        assert 0 <= r["zero_std_groups"] <= 2
        adapter = Path(r["path"])
        config = json.loads((adapter / "adapter_config.json").read_text())
        assert config["r"] == 8 and config["lora_alpha"] == 16
        assert (adapter / "adapter_model.safetensors").is_file()
    # The journal in the run directory holds the same records.
    assert [r["step"] for r in read_jsonl(d / "run" / "checkpoints.jsonl")] == [1, 2, 3]
    # Progress on stderr, one line per step.
    assert "step 1/3" in result.stderr and "step 3/3" in result.stderr


def test_training_changes_the_adapter(full_run):
    from safetensors.torch import load_file

    _, _, records = full_run
    first = load_file(str(Path(records[0]["path"]) / "adapter_model.safetensors"))
    last = load_file(str(Path(records[-1]["path"]) / "adapter_model.safetensors"))
    # LoRA's B matrices start at zero; optimiser steps with non-zero advantages move them.
    moved = [k for k in first if "lora_B" in k and (last[k] - first[k]).abs().max() > 0]
    assert moved, "no LoRA weight changed between step 1 and step 3"
    assert any(r["grad_norm"] > 0 for r in records if r["zero_std_groups"] < 2)


def test_validation_on_held_out_seeds(full_run):
    d, _, records = full_run
    assert "val_reward" not in records[0]
    for r in records[1:]:
        assert r["val_episodes"] == 2 and r["val_n"] == [3]
        assert isinstance(r["val_reward"], float) and 0.0 <= r["val_deadlock_rate"] <= 1.0
        assert not set(r["train_seeds"]) & {900, 901}
    episodes = read_jsonl(d / "ep.jsonl")
    val = [e for e in episodes if e["split"] == "val"]
    assert sorted({(e["checkpoint_step"], e["seed"]) for e in val}) == [
        (2, 900),
        (2, 901),
        (3, 900),
        (3, 901),
    ]
    # Validation at a step uses that step's adapter.
    assert all(e["adapter"] == records[e["checkpoint_step"] - 1]["path"] for e in val)


def test_episodes_out_keeps_every_training_episode_scored_and_replayable(full_run):
    d, _, records = full_run
    episodes = read_jsonl(d / "ep.jsonl")
    train = [e for e in episodes if e["split"] == "train"]
    assert len(train) == 3 * 2 * 2
    assert len({e["episode_id"] for e in episodes}) == len(episodes)
    for e in train:
        # Played with the adapter of the previous step (0 = the base model).
        assert e["checkpoint_step"] == e["train_step"] - 1
        assert e["reward"]["variant"] == "paper"
        assert all(t["raw"].startswith("ACTION: ") for t in e["turns"])
        rescored = score_record(json.loads(json.dumps(e)), RewardSpec())
        assert rescored["reward"]["total"] == pytest.approx(e["reward"]["total"])
    for r in records:
        mine = [e["reward"]["total"] for e in train if e["train_step"] == r["step"]]
        assert r["train_reward"] == pytest.approx(sum(mine) / len(mine))
        assert sorted({e["seed"] for e in train if e["train_step"] == r["step"]}) == sorted(r["train_seeds"])


def test_resume_continues_without_duplicates_and_matches_a_straight_run(full_run, tiny, prompt_file, tmp_path):
    _, _, straight = full_run
    run_dir, ep = tmp_path / "run", tmp_path / "ep.jsonl"
    common = ("--val-every", "2", "--val-seeds", "900-901", "--episodes-out", str(ep))
    first, recs1 = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "2", *common))
    assert first.exit_code == 0, first.stderr
    assert [r["step"] for r in recs1] == [1, 2]
    second, recs2 = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "3", *common))
    assert second.exit_code == 0, second.stderr
    assert "resuming after step 2" in second.stderr
    assert [r["step"] for r in recs2] == [3]
    journal = read_jsonl(run_dir / "checkpoints.jsonl")
    assert [r["step"] for r in journal] == [1, 2, 3]
    episodes = read_jsonl(ep)
    assert len({e["episode_id"] for e in episodes}) == len(episodes) == 3 * 4 + 2 * 2
    # Same scenarios and the same optimisation as the uninterrupted run.
    assert recs2[0]["train_seeds"] == straight[2]["train_seeds"]
    assert recs2[0]["train_reward"] == pytest.approx(straight[2]["train_reward"])
    # Nothing left to do: a third call says so and writes nothing.
    third, recs3 = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "3", *common))
    assert third.exit_code == 0 and recs3 == [] and "nothing to do" in third.stderr


def test_resume_refuses_changed_settings(tiny, prompt_file, tmp_path):
    run_dir = tmp_path / "run"
    ok, _ = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "1"))
    assert ok.exit_code == 0
    bad, recs = invoke(base_args(tiny, prompt_file, run_dir, "--steps", "2", "--lora-rank", "4"))
    assert bad.exit_code == 64 and recs == []
    assert "lora_rank" in bad.stderr


def test_staged_curriculum_and_shaped_reward(tiny, prompt_file, tmp_path):
    result, records = invoke(
        base_args(
            tiny,
            prompt_file,
            tmp_path / "run",
            "--shaped",
            "--curriculum",
            "3:1,4:1",
            "--val-every",
            "2",
            "--val-episodes",
            "1",
        )
    )
    assert result.exit_code == 0, result.stderr
    assert [r["n"] for r in records] == [[3], [4]]
    assert all(r["reward_variant"] == "shaped" for r in records)
    assert records[1]["val_n"] == [3, 4] and set(records[1]["val_reward_by_n"]) == {"3", "4"}


def test_auto_curriculum_advances_when_the_reward_passes_the_bar(tiny, prompt_file, tmp_path):
    result, records = invoke(
        base_args(
            tiny,
            prompt_file,
            tmp_path / "run",
            "-n",
            "3,4",
            "--steps",
            "2",
            "--curriculum",
            "auto",
            "--advance-at",
            "-100",
            "--group-size",
            "2",
        )
    )
    assert result.exit_code == 0, result.stderr
    assert [r["n"] for r in records] == [[3], [4]]
    assert records[0]["curriculum_state"]["stage"] == 1


def test_free_decoding_parses_generated_text(tiny, prompt_file, tmp_path):
    ep = tmp_path / "ep.jsonl"
    result, records = invoke(
        base_args(
            tiny,
            prompt_file,
            tmp_path / "run",
            "--steps",
            "1",
            "--decode",
            "free",
            "--max-new-tokens",
            "4",
            "--episodes-out",
            str(ep),
        )
    )
    assert result.exit_code == 0, result.stderr
    assert len(records) == 1
    for e in read_jsonl(ep):
        for t in e["turns"]:
            assert t["completion_tokens"] <= 4
            # Whatever a random model says is parsed as on the API path: an action or null.
            assert t["action"] is None or t["action"] in (
                "pick-up-left",
                "pick-up-right",
                "put-down-left",
                "put-down-right",
                "eat",
                "think",
            )


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--curriculum", "auto"], "--advance-at"),
        (["--val-seeds", "1-3"], "--val-every"),
        (["--val-every", "1", "--val-seeds", "1-2", "--val-episodes", "5"], "only 2"),
        (["--memory", "sometimes"], "--memory"),
        (["-n", "1"], "at least 2"),
    ],
)
def test_bad_options_exit_64_before_loading_a_model(tmp_path, extra, match):
    args = ["--base-model", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "r"), *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 64, result.output
    assert match in result.stderr


def test_missing_model_directory_exits_66(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "--base-model",
            str(tmp_path / "nowhere"),
            "--run-dir",
            str(tmp_path / "r"),
            "--steps",
            "1",
        ],
    )
    assert result.exit_code == 66
    assert "nowhere" in result.stderr


def test_installed_command_through_a_real_pipe(tiny, prompt_file, tmp_path):
    proc = run(
        ["dphil-train", *base_args(tiny, prompt_file, tmp_path / "run", "--steps", "1", "-q")],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    (record,) = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert record["kind"] == "checkpoint" and record["step"] == 1
    assert proc.stderr.decode().strip() == "" or "warn" in proc.stderr.decode().lower()


def test_two_runs_of_the_same_command_train_the_same_adapter(tiny, prompt_file, tmp_path):
    """LoRA initialisation, scenarios and sampling are all seeded: same command, same weights."""
    outs = []
    for name in ("a", "b"):
        result, records = invoke(base_args(tiny, prompt_file, tmp_path / name, "--steps", "2", "--run", "same"))
        assert result.exit_code == 0, result.stderr
        outs.append(records)
    a, b = outs
    assert [r["train_reward"] for r in a] == [r["train_reward"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        wa = (Path(ra["path"]) / "adapter_model.safetensors").read_bytes()
        wb = (Path(rb["path"]) / "adapter_model.safetensors").read_bytes()
        assert wa == wb
