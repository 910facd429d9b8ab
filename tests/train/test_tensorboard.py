"""`dphil-train --tensorboard`: the event files hold exactly the checkpoint records' numbers.

A real (tiny, CPU) training run writes the events; TensorBoard's own reader
(`EventAccumulator`, what `tensorboard --logdir` uses) reads them back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dphil.train.tensorboard_log import SCALARS, scalars
from tests.train.test_train_cli import base_args, invoke, read_jsonl

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("tensorboard")


def read_events(directory: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a step shows twice: {steps}"
        out[tag] = {e.step: e.value for e in events}
    return out


def test_event_files_hold_every_checkpoint_number_per_step(tiny, prompt_file, tmp_path):
    run_dir = tmp_path / "run"
    common = ("--val-every", "2", "--val-seeds", "900-901")
    # Step 1 without the flag, step 2 with it, step 3 resumed with it: each resume rewrites the
    # journal's steps into the log and hides the earlier events, so every step shows once.
    records = []
    for steps, flag in (("1", ()), ("2", ("--tensorboard",)), ("3", ("--tensorboard",))):
        result, more = invoke(base_args(tiny, prompt_file, run_dir, "--steps", steps, *common, *flag))
        assert result.exit_code == 0, result.stderr
        records += more
    assert [r["step"] for r in records] == [1, 2, 3]
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2

    events = read_events(run_dir)
    expected: dict[str, dict[int, float]] = {}
    for r in records:
        for tag, value in scalars(r).items():
            expected.setdefault(tag, {})[r["step"]] = value
    assert set(events) == set(expected)
    for tag, per_step in expected.items():
        assert events[tag] == pytest.approx(per_step, rel=1e-6, abs=1e-7), tag

    # The metrics the issue names are all there, validation only where it ran.
    for tag in (
        "train/reward",
        "train/meals",
        "train/deadlock_rate",
        "train/zero_std_groups",
        "loss/loss",
        "loss/kl",
        "optim/learning_rate",
        "time/seconds_per_step",
    ):
        assert sorted(events[tag]) == [1, 2, 3], tag
    # Validation ran every 2 steps and at each invocation's last step (1, 2, 3 here).
    validated = [r["step"] for r in records if "val_reward" in r]
    assert validated == [1, 2, 3]
    assert sorted(events["val/reward"]) == sorted(events["val/reward_n3"]) == validated
    assert events["train/reward"][3] == pytest.approx(records[2]["train_reward"])
    assert events["time/seconds_per_step"][1] == pytest.approx(records[0]["seconds"])
    # And the journal agrees with stdout, so the log can be rebuilt from either.
    assert [r["train_reward"] for r in read_jsonl(run_dir / "checkpoints.jsonl")] == [
        r["train_reward"] for r in records
    ]


def test_every_tag_names_a_checkpoint_field():
    assert len(set(SCALARS.values())) == len(SCALARS)
    record = {
        "step": 4,
        "train_reward": 0.5,
        "kl": None,
        "zero_std_groups": 1,
        "groups": 2,
        "val_reward_by_n": {"5": 0.25, "10": None},
        "deadlock": True,
    }
    assert scalars(record) == {"train/reward": 0.5, "train/zero_std_groups": 1.0, "val/reward_n5": 0.25}


def test_without_the_flag_tensorboard_is_never_imported(tiny, prompt_file, tmp_path):
    args = base_args(tiny, prompt_file, tmp_path / "run", "--steps", "1")
    code = (
        "import sys, json\n"
        "from dphil.commands.train import main\n"
        "try:\n"
        f"    main({json.dumps(args)})\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "loaded = sorted(m for m in sys.modules if 'tensorboard' in m.lower())\n"
        "assert 'torch' in sys.modules\n"
        "print(json.dumps(loaded))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = proc.stdout.decode().splitlines()
    assert json.loads(lines[-1]) == []
    assert json.loads(lines[0])["kind"] == "checkpoint"
    assert not list((tmp_path / "run").glob("events.out.tfevents.*"))
