"""Run directories that move: resume, selection and evaluation never read another directory's files.

Checkpoint records carry `run_id` (from the run directory's run.json), `run_dir` and
`path_in_run`; readers find the adapter from where the record was read, not from the
working directory (`dphil.checkpoints.record.adapter_path`), and a resume continues from
the run directory it was given and refuses a journal of another run (exit 65).

Every run here is the tiny Qwen3 model for two or three steps (a few seconds each).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.commands import run
from tests.train.test_train_cli import base_args

pytest.importorskip("torch")
pytest.importorskip("peft")

WEIGHTS = "adapter_model.safetensors"
OPTIMIZER = "optimizer.pt"


def train(tiny: Path, prompt_file: Path, run_dir: str | Path, steps: int, *extra: str, cwd: Path | None = None):
    """dphil-train as a real process (so the working directory is the one given); its records and stderr."""
    proc = run(
        ["dphil-train", *base_args(tiny, prompt_file, Path(run_dir), "--steps", str(steps), *extra)],
        cwd=cwd,
        timeout=600,
    )
    records = [json.loads(x) for x in proc.stdout.decode().splitlines() if x.strip()]
    return proc, records


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def weights(run_dir: Path, step: int) -> bytes:
    return (run_dir / "steps" / f"{step:04d}" / WEIGHTS).read_bytes()


@pytest.fixture(scope="module")
def straight(tiny, prompt_file, tmp_path_factory):
    """Three steps straight through: what every resumed run below must reproduce byte for byte."""
    d = tmp_path_factory.mktemp("straight")
    proc, records = train(tiny, prompt_file, d / "run", 3)
    assert proc.returncode == 0, proc.stderr.decode()
    return d / "run", records


@pytest.fixture(scope="module")
def moved(tiny, prompt_file, tmp_path_factory):
    """Two steps in old/run (records to old/ckpts.jsonl beside it), then `mv old new`, renamed to new/moved."""
    d = tmp_path_factory.mktemp("moving")
    old = d / "old"
    old.mkdir()
    proc, records = train(tiny, prompt_file, "run", 2, cwd=old)  # a relative --run-dir
    assert proc.returncode == 0, proc.stderr.decode()
    (old / "ckpts.jsonl").write_bytes(proc.stdout)
    subprocess.run(["mv", str(old), str(d / "new")], check=True)
    subprocess.run(["mv", str(d / "new" / "run"), str(d / "new" / "moved")], check=True)
    return d, d / "new" / "moved", records


def test_records_name_the_run_and_the_adapter_inside_it(straight):
    run_dir, records = straight
    settings = json.loads((run_dir / "run.json").read_text())
    assert len(settings["run_id"]) == 32 and int(settings["run_id"], 16) >= 0
    for r in records:
        assert r["run_id"] == settings["run_id"]
        assert r["run_dir"] == str(run_dir) and Path(r["path"]).is_absolute()
        assert r["path_in_run"] == f"steps/{r['step']:04d}"
        assert Path(r["path"]) == run_dir / r["path_in_run"]
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "checkpoint.schema.json").read_text())
    jsonschema = pytest.importorskip("jsonschema")
    for r in records:
        jsonschema.validate(r, schema)


def test_resume_from_a_directory_holding_another_run_uses_its_own_run_dir(tiny, prompt_file, straight, tmp_path):
    """The issue's case: `--run-dir /abs/B/run` from a directory that holds another `run`."""
    straight_dir, straight_records = straight
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    other, _ = train(tiny, prompt_file, "run", 2, "--lr", "2e-2", cwd=a)  # another run, other weights
    assert other.returncode == 0, other.stderr.decode()
    mine, _ = train(tiny, prompt_file, "run", 2, cwd=b)
    assert mine.returncode == 0, mine.stderr.decode()
    assert weights(a / "run", 2) != weights(b / "run", 2)
    resumed, records = train(tiny, prompt_file, b / "run", 3, cwd=a)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert f"resuming after step 2 from {b / 'run' / 'steps' / '0002'}" in resumed.stderr.decode()
    assert [r["step"] for r in records] == [3]
    # The continuation of B, byte for byte as if it had never stopped; A is untouched.
    assert weights(b / "run", 3) == weights(straight_dir, 3)
    assert records[0]["train_reward"] == straight_records[2]["train_reward"]
    assert not (a / "run" / "steps" / "0003").exists()


def test_a_moved_and_renamed_run_resumes_as_if_unmoved(tiny, prompt_file, straight, moved, tmp_path):
    straight_dir, straight_records = straight
    _, run_dir, before = moved
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)  # resumed here, so the other tests keep a two-step run
    resumed, records = train(tiny, prompt_file, copy, 3, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert "resuming after step 2" in resumed.stderr.decode()
    (rec,) = records
    assert rec["step"] == 3 and rec["run"] == "run"  # the name it was started with, not the new directory's
    assert rec["run_id"] == before[0]["run_id"] and rec["run_dir"] == str(copy)
    assert weights(copy, 3) == weights(straight_dir, 3)
    assert (copy / "steps" / "0003" / OPTIMIZER).read_bytes() == (
        straight_dir / "steps" / "0003" / OPTIMIZER
    ).read_bytes()
    assert rec["train_reward"] == straight_records[2]["train_reward"]
    assert rec["train_seeds"] == straight_records[2]["train_seeds"]


def test_resume_refuses_a_journal_of_another_run(tiny, prompt_file, moved, tmp_path):
    _, run_dir, _ = moved
    mine = tmp_path / "mine"
    first, _ = train(tiny, prompt_file, mine, 1)
    assert first.returncode == 0, first.stderr.decode()
    # Another run's journal (same settings, same step numbers) dropped into this directory.
    (mine / "checkpoints.jsonl").write_bytes((run_dir / "checkpoints.jsonl").read_bytes())
    shutil.copytree(run_dir / "steps" / "0002", mine / "steps" / "0002")
    refused, records = train(tiny, prompt_file, mine, 3)
    err = refused.stderr.decode().strip()
    assert refused.returncode == 65, err
    assert records == [] and len(err.splitlines()) == 1
    assert "checkpoints.jsonl:1" in err and "another run" in err
    assert not (mine / "steps" / "0003").exists()


def test_checkpoints_and_selection_find_a_moved_run_from_another_directory(tiny, prompt_file, moved, tmp_path):
    from dphil.checkpoints.record import load_checkpoints

    d, run_dir, records = moved
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "run" / "steps" / "0002").mkdir(parents=True)  # a decoy where the old relative paths led
    journal = run_dir / "checkpoints.jsonl"
    # dphil-ckpt-select: the path check and --export, from another working directory.
    out = tmp_path / "exported"
    proc = run(["dphil-ckpt-select", "--by", "last", str(journal), "--export", str(out)], cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr.decode()
    (chosen,) = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert chosen["step"] == 2 and chosen["path"] == records[1]["path"]  # the record as read
    assert (out / WEIGHTS).read_bytes() == (run_dir / "steps" / "0002" / WEIGHTS).read_bytes()
    # Records piped in: found from the working directory, here the run directory itself.
    piped = run(["dphil-ckpt-select", "--by", "last", "-"], input=journal.read_bytes(), cwd=run_dir)
    assert piped.returncode == 0, piped.stderr.decode()
    # The stdout records kept beside the run: found while the run keeps its recorded name; here it
    # was renamed, so the path as written is used, and it is gone (exit 66, naming it).
    lost = run(["dphil-ckpt-select", "--by", "last", str(d / "new" / "ckpts.jsonl")], cwd=elsewhere)
    assert lost.returncode == 66 and b"does not exist" in lost.stderr
    # dphil-rollout --checkpoints: every step's adapter played, loaded from the moved directory.
    proc = run(
        [
            "dphil-rollout",
            "--checkpoints",
            str(journal),
            "--seeds",
            "5",
            "--prompt-file",
            str(prompt_file),
            "-n",
            "3",
            "--rounds",
            "2",
            "--memory",
            "none",
            "--threads",
            "1",
        ],
        cwd=elsewhere,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    episodes = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert sorted(e["checkpoint_step"] for e in episodes) == [1, 2]
    assert all(e["status"] == "complete" and e["run"] == "run" for e in episodes)
    # Episodes record the adapter as training wrote it, so moving a run changes no episode id.
    assert {e["adapter"] for e in episodes} == {r["path"] for r in records}
    # The library call behind both commands.
    (ckpt,) = [c for c in load_checkpoints([str(journal)]) if c.step == 2]
    assert ckpt.adapter_path() == str(run_dir / "steps" / "0002")


def test_records_beside_a_moved_run_and_piped_records(moved, tmp_path):
    from dphil.checkpoints.record import adapter_path, find_run_dir

    d, run_dir, records = moved
    rec = {**records[1]}
    # Beside the run directory under its recorded name: found.
    beside = d / "new" / "ckpts.jsonl"
    renamed_back = tmp_path / "back"
    shutil.copytree(run_dir, renamed_back / "run")
    (renamed_back / "ckpts.jsonl").write_bytes(beside.read_bytes())
    assert adapter_path(rec, str(renamed_back / "ckpts.jsonl")) == str(renamed_back / "run" / "steps" / "0002")
    # Read from stdin, the working directory stands in for the file's directory.
    cwd = os.getcwd()
    try:
        os.chdir(run_dir)
        assert adapter_path(rec, "<stdin>") == str(run_dir / "steps" / "0002")
        os.chdir(tmp_path)
        assert find_run_dir(rec, "<stdin>") is None
        assert adapter_path(rec, "<stdin>") == rec["path"]  # not found: the path as written
    finally:
        os.chdir(cwd)
    # A record whose path was edited to point elsewhere is taken at its word.
    edited = {**rec, "path": str(tmp_path / "deleted-adapter")}
    assert adapter_path(edited, str(run_dir / "checkpoints.jsonl")) == str(tmp_path / "deleted-adapter")


def old_format(record: dict, path: str) -> dict:
    """A checkpoint record in the shape written before run ids: `path` as given, nothing else."""
    old = {k: v for k, v in record.items() if k not in ("run_id", "run_dir", "path_in_run")}
    return {**old, "path": path}


def test_old_format_records_and_run_dirs_still_load_and_resume(tiny, prompt_file, straight, tmp_path):
    from dphil.checkpoints.record import load_checkpoints

    straight_dir, straight_records = straight
    where = tmp_path / "cwd"
    where.mkdir()
    proc, _ = train(tiny, prompt_file, "run", 2, cwd=where)
    assert proc.returncode == 0, proc.stderr.decode()
    run_dir = where / "run"
    # Rewrite the run directory as today's version left it: no run_id anywhere, cwd-relative paths.
    settings = json.loads((run_dir / "run.json").read_text())
    del settings["run_id"]
    (run_dir / "run.json").write_text(json.dumps(settings, indent=2) + "\n")
    journal = [old_format(r, f"run/steps/{r['step']:04d}") for r in read_jsonl(run_dir / "checkpoints.jsonl")]
    (run_dir / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in journal))
    # Old records still read, relative to the working directory as they always were.
    sel = run(["dphil-ckpt-select", "--by", "last", str(run_dir / "checkpoints.jsonl")], cwd=where)
    assert sel.returncode == 0, sel.stderr.decode()
    absolute = tmp_path / "abs.jsonl"
    absolute.write_text(json.dumps(old_format(journal[0], str(run_dir / "steps" / "0001"))) + "\n")
    assert run(["dphil-ckpt-select", "--by", "last", str(absolute)], cwd=tmp_path).returncode == 0
    (ckpt,) = load_checkpoints([str(absolute)])
    assert ckpt.adapter_path() == str(run_dir / "steps" / "0001")
    # Moved, the old run resumes from its own steps/, gets a run_id, and continues byte for byte.
    moved = tmp_path / "moved"
    subprocess.run(["mv", str(run_dir), str(moved)], check=True)
    resumed, records = train(tiny, prompt_file, moved, 3, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr.decode()
    new_id = json.loads((moved / "run.json").read_text())["run_id"]
    assert records[0]["run_id"] == new_id and records[0]["path_in_run"] == "steps/0003"
    assert weights(moved, 3) == weights(straight_dir, 3)
    assert records[0]["train_reward"] == straight_records[2]["train_reward"]
