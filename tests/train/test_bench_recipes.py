"""bench/recipes.py --smoke: the recipe experiment end to end, and resumed where it stopped.

The smoke size trains the study's recipe and dphil's two credit-assignment
candidates for two steps on the tiny model, picks the better on validation,
evaluates every arm on held-out test seeds through dphil-rollout --checkpoints,
and compares them with dphil-stats. It takes a few minutes on two cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def smoke(work: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "recipes.py"), "--smoke", "--work", str(work), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=1500,
        cwd=ROOT,
        check=False,
    )


def test_the_recipe_experiment_runs_end_to_end_and_resumes(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results"
    first = smoke(work, out)
    assert first.returncode == 0, first.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    best = summary["advantage_choice"]["advantage"]
    assert best in ("philosopher", "step")
    other = "step" if best == "philosopher" else "philosopher"
    arms = {"base", "study", "dphil", f"abl-{other}", "abl-last"}
    for yardstick in ("shaped", "paper"):
        cells = summary[yardstick]["cells"]
        assert {k.split("/")[0] for k in cells} == arms
        assert all(c["episodes"] == 4 for c in cells.values())  # 4 test seeds per N, one seed
        table = (out / f"table-{yardstick}.md").read_text()
        assert "recipe: study → dphil" in table and "recipe: base → study" in table
    for name in ("study", "dphil-philosopher", "dphil-step"):
        assert (out / f"curve-{name}.png").stat().st_size > 1000
        runs = summary["training"][name]
        assert [list(steps) for steps in runs.values()] == [["1", "2"]]
    # Every checkpoint records its credit assignment.
    journal = work / f"run-dphil-{best}-s0" / "checkpoints.jsonl"
    assert all(json.loads(line)["advantage"]["mode"] == best for line in journal.read_text().splitlines())
    study_dphil = summary["shaped"]["comparisons"]["study→dphil n=3"]
    assert study_dphil["clustered"]["field"] == "run" and study_dphil["clustered"]["b_units"] == 1
    assert summary["advantage_choice"]["seeds"] == [0]
    assert (work / f"test-dphil-{best}.jsonl").exists()
    # Seeds only grow: a part that leaves out a seed already run is refused before any work.
    fewer = smoke(work, out, "--seeds", "1")
    assert fewer.returncode != 0 and "seeds only grow" in fewer.stderr
    assert not (work / "run-study-s1").exists()
    # A choice from before choices named their seeds (and the dphil arm's file its mode) is made
    # again over these seeds; its test file is renamed for the mode it played, and kept.
    stale = {"advantage": other, "val_scores": {}}
    (work / "choice.json").write_text(json.dumps(stale) + "\n")
    played = (work / f"test-dphil-{best}.jsonl").read_text()
    (work / f"test-dphil-{best}.jsonl").rename(work / "test-dphil.jsonl")
    # Stopped part-way through an evaluation (a torn journal), it carries on and trains nothing again.
    test_file = work / "test-study.jsonl"
    lines = test_file.read_text().splitlines(keepends=True)
    test_file.write_text("".join(lines[:3]) + lines[3][:20])
    (work / "test-all.shaped.jsonl").unlink()
    (work / "test-all.paper.jsonl").unlink()
    again = smoke(work, out)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "phase 1: 0 job(s)" in again.stderr and "phase 2 (" in again.stderr
    assert "phase 3: 2 test rollout(s)" in again.stderr  # study's torn journal, dphil's for the new choice
    assert (work / f"test-dphil-{other}.jsonl").read_text() == played
    assert sum(1 for line in test_file.read_text().splitlines() if line.strip()) == 8
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["shaped"]["cells"]["study/n=3"]["episodes"] == 4
    assert f"the credit mode changes from {other} to {best}" in again.stderr
    choice = resumed["advantage_choice"]
    assert (choice["advantage"], choice["seeds"], choice["earlier"]) == (best, [0], [stale])
    assert [(p["seeds"], p["stopped"]) for p in resumed["parts"]] == [([0], False), ([1], True), ([0], False)]
    assert resumed["seconds_total"] == sum(p["seconds"] for p in resumed["parts"])
    # What a later part needs is kept beside the results (committed, unlike the work directory);
    # a fresh work directory (another machine) is filled from it and nothing runs again.
    kept = out / "work"
    assert (kept / "choice.json.gz").is_file() and (kept / "run-study-s0" / "checkpoints.jsonl.gz").is_file()
    assert (kept / f"test-dphil-{best}.jsonl.gz").is_file() and (kept / "parts.jsonl.gz").is_file()
    assert not list(kept.rglob("test-all.*")) and not list(kept.rglob("*.safetensors"))
    fresh = tmp_path / "fresh"
    moved = smoke(fresh, out)
    assert moved.returncode == 0, moved.stderr[-4000:]
    assert "work file(s) restored" in moved.stderr
    assert "phase 1: 0 job(s)" in moved.stderr and "phase 3: 0 test rollout(s)" in moved.stderr
    assert json.loads((out / "summary.json").read_text())["shaped"]["cells"] == resumed["shaped"]["cells"]
    # Test episodes still to play on a run whose adapter stayed behind: named, never a failed rollout each.
    (fresh / "test-study.jsonl").unlink()
    lost = smoke(fresh, out)
    assert lost.returncode != 0 and "is not here" in lost.stderr and "run-study-s0" in lost.stderr


def test_a_training_temperature_reaches_every_run_and_keeps_its_own_directories(tmp_path, monkeypatch):
    """--temperature: every recipe's dphil-train samples at it; the default leaves old command lines alone."""
    import argparse

    from tests.support.commands import load_script

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    recipes = load_script("bench/recipes.py")
    from recipes_commands import Commands
    from recipes_plan import SIZES

    def job(temperature: float) -> list[str]:
        args = argparse.Namespace(gpu=False, real=True, lr=1e-4, autocast=[], temperature=temperature)
        _, argv = Commands(args, SIZES["real"], tmp_path).train_job(
            "study", {"reward": "paper", "advantage": "episode", "sizes": ["-n", "5"]}, 0, "model-dir"
        )
        return argv

    hot = job(1.5)
    assert hot[hot.index("--temperature") + 1] == "1.5"
    assert "--temperature" not in job(1.0)

    def dirs(temperature: float, size: str = "real") -> tuple[Path, Path]:
        args = argparse.Namespace(size=size, smoke=size == "smoke", temperature=temperature, work=None, out=None)
        return recipes.directories(args)

    assert [p.name for p in dirs(1.0)] == ["recipes-real", "recipes-real"]
    assert [p.name for p in dirs(1.5)] == ["recipes-real-t1.5", "recipes-real-t1.5"]
    assert dirs(1.5, "smoke")[1] == dirs(1.5, "smoke")[0] / "results"


def test_a_built_in_prompt_reaches_training_and_test_and_keeps_its_own_directories(tmp_path, monkeypatch):
    """--prompt seat-last: named in every dphil-train and dphil-rollout line; the default left unnamed."""
    import argparse

    from tests.support.commands import load_script

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    recipes = load_script("bench/recipes.py")
    from recipes_commands import Commands
    from recipes_plan import SIZES

    def lines(prompt: str) -> tuple[list[str], list[str]]:
        args = argparse.Namespace(gpu=False, real=True, lr=1e-4, autocast=[], temperature=1.0, prompt=prompt)
        commands = Commands(args, SIZES["real"], tmp_path)
        _, train = commands.train_job(
            "study", {"reward": "paper", "advantage": "episode", "sizes": ["-n", "5"]}, 0, "m"
        )
        _, test = commands.test_job("base", ["-m", "hf:m"], tmp_path / "test-base.jsonl")
        return train, test

    for argv in lines("seat-last"):
        assert argv[argv.index("--prompt") + 1] == "seat-last"
    assert all("--prompt" not in argv for argv in lines("default"))
    args = argparse.Namespace(size="real", smoke=False, temperature=1.5, prompt="seat-last", work=None, out=None)
    assert [p.name for p in recipes.directories(args)] == ["recipes-real-t1.5-pseat-last"] * 2
    bad = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "recipes.py"), "--prompt", "seat-last", "--work", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "tiny model plays its own prompt" in bad.stderr


def test_a_credit_mode_fixed_in_advance_trains_only_that_mode_and_is_recorded(tmp_path, monkeypatch):
    """--credit step: no philosopher run (unless the 'other' ablation asks), choice.json says fixed,
    and a work directory whose mode was chosen on validation refuses a fixed one (and back)."""
    import types

    from tests.support.commands import load_script

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    recipes = load_script("bench/recipes.py")
    from recipes_plan import recipes as plan

    assert set(plan(8, None, set())) == {"study", "dphil-philosopher", "dphil-step"}
    assert set(plan(8, None, set(), "step")) == {"study", "dphil-step"}
    assert set(plan(8, None, {"other"}, "step")) == {"study", "dphil-philosopher", "dphil-step"}

    def experiment(credit: str, work: Path) -> types.SimpleNamespace:
        return types.SimpleNamespace(args=types.SimpleNamespace(credit=credit), work=work, seeds=[1, 0])

    fixed = tmp_path / "fixed"
    fixed.mkdir()
    assert recipes.Experiment.choose(experiment("step", fixed)) == "step"
    choice = json.loads((fixed / "choice.json").read_text())
    assert choice["advantage"] == "step" and choice["fixed"] is True and choice["seeds"] == [0, 1]
    with pytest.raises(SystemExit, match="credit mode was fixed"):
        recipes.Experiment.choose(experiment("val", fixed))
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    (chosen / "choice.json").write_text(json.dumps({"advantage": "philosopher", "seeds": [0, 1]}))
    with pytest.raises(SystemExit, match="chosen on validation"):
        recipes.Experiment.choose(experiment("step", chosen))
    assert recipes.Experiment.choose(experiment("val", chosen)) == "philosopher"
