"""Local models at the table: `-m hf:PATH --adapter DIR` and the checkpoint loop of issue 6.

    dphil-train ... > ckpts.jsonl
    dphil-rollout --checkpoints ckpts.jsonl --seeds ... | dphil-score --shaped \
        | dphil-ckpt-select --by val ckpts.jsonl -

runs here for real with a tiny Qwen3 model built in the test (no download).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.commands import PROMPT, command_path, run

pytest.importorskip("torch")
pytest.importorskip("peft")

LOCAL = ["-n", "3", "--rounds", "2", "--memory", "none", "--threads", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny base model and two real training steps of dphil-train (adapters + checkpoint records)."""
    from tests.support.tinymodel import build_tiny_model

    d = tmp_path_factory.mktemp("loop")
    model = build_tiny_model(d / "model")
    prompt = d / "prompt.txt"
    prompt.write_text(PROMPT)
    proc = run(
        [
            "dphil-train",
            "--base-model",
            str(model),
            "--run-dir",
            str(d / "run"),
            "--steps",
            "2",
            "--groups",
            "1",
            "--group-size",
            "2",
            "--lr",
            "5e-3",
            "--prompt-file",
            str(prompt),
            "--seed",
            "3",
            *LOCAL,
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    (d / "ckpts.jsonl").write_bytes(proc.stdout)
    return d, model, prompt


def records(data: bytes) -> list[dict]:
    return [json.loads(x) for x in data.splitlines()]


def untimed(recs: list[dict]) -> list[dict]:
    for r in recs:
        for t in r["turns"]:
            assert isinstance(t.pop("latency_s"), float)
    return recs


def test_checkpoints_feed_validation_and_selection(trained):
    d, model, prompt = trained
    ckpts = d / "ckpts.jsonl"
    rollout = [
        command_path("dphil-rollout"),
        "--checkpoints",
        str(ckpts),
        "--seeds",
        "1000-1002",
        "--prompt-file",
        str(prompt),
        *LOCAL,
    ]
    pipeline = (
        f"{' '.join(map(repr, rollout))} | '{command_path('dphil-score')}' --shaped | tee '{d}/val.jsonl' "
        f"| '{command_path('dphil-ckpt-select')}' --by val '{ckpts}' - > '{d}/best.jsonl'"
    )
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    val = records((d / "val.jsonl").read_bytes())
    steps = [json.loads(x)["step"] for x in ckpts.read_text().splitlines()]
    assert sorted({r["checkpoint_step"] for r in val}) == steps == [1, 2]
    assert len(val) == 2 * 3
    assert all(
        r["model"] == f"hf:{model}" and r["status"] == "complete" and r["reward"]["variant"] == "shaped" for r in val
    )
    assert all(Path(r["adapter"]).is_dir() and r["run"] for r in val)
    assert len({r["episode_id"] for r in val}) == 6  # checkpoints give distinct ids on the same seeds
    best = records((d / "best.jsonl").read_bytes())
    assert len(best) == 1 and best[0]["kind"] == "checkpoint"
    sel = best[0]["selection"]
    assert sel["by"] == "val" and sel["candidates"] == 2 and sel["last_step"] == 2


def test_hf_model_with_adapter_is_reproducible_and_resumable(trained, tmp_path):
    d, model, prompt = trained
    adapter = json.loads((d / "ckpts.jsonl").read_text().splitlines()[0])["path"]
    args = [
        "dphil-rollout",
        "-m",
        f"hf:{model}",
        "--adapter",
        adapter,
        "--seeds",
        "5,6",
        "--prompt-file",
        str(prompt),
        *LOCAL,
    ]
    first, second = run(args), run(args)
    assert first.returncode == 0, first.stderr.decode()
    # The same episodes, but for each turn's latency_s (wall time, which no seed fixes).
    assert untimed(records(first.stdout)) == untimed(records(second.stdout))
    recs = records(first.stdout)
    assert [r["seed"] for r in recs] == [5, 6] and all(r["adapter"] == adapter for r in recs)
    assert all(t["action"] is not None for r in recs for t in r["turns"])  # constrained decoding always acts
    out = tmp_path / "ep.jsonl"
    assert run([*args, "-o", str(out), "--resume"]).returncode == 0
    again = run([*args, "-o", str(out), "--resume"])
    assert again.returncode == 0 and b"2 episode(s) already complete" in again.stderr
    assert len(records(out.read_bytes())) == 2
    base = run(["dphil-rollout", "-m", f"hf:{model}", "--seeds", "5,6", "--prompt-file", str(prompt), *LOCAL])
    assert {r["episode_id"] for r in records(base.stdout)}.isdisjoint({r["episode_id"] for r in recs})


def test_missing_adapter_and_misused_options(trained, tmp_path):
    d, _, _ = trained
    gone = tmp_path / "ckpts.jsonl"
    rec = json.loads((d / "ckpts.jsonl").read_text().splitlines()[0])
    rec["path"] = str(tmp_path / "deleted-adapter")
    gone.write_text(json.dumps(rec) + "\n")
    proc = run(["dphil-rollout", "--checkpoints", str(gone), *LOCAL])
    assert proc.returncode == 66 and b"deleted-adapter" in proc.stderr
    assert run(["dphil-rollout", "-m", "scripted:naive", "--adapter", str(d)]).returncode == 64
    assert run(["dphil-rollout", "-m", "hf:", *LOCAL]).returncode == 64


def test_local_turns_keep_the_reply_as_raw_and_old_records_still_read(trained, tmp_path):
    from dphil.core.records import SCHEMA_VERSION, turn_raw

    _, model, prompt = trained
    proc = run(["dphil-rollout", "-m", f"hf:{model}", "--seeds", "7", "--prompt-file", str(prompt), *LOCAL])
    assert proc.returncode == 0, proc.stderr.decode()
    rec = records(proc.stdout)[0]
    assert rec["schema_version"] == SCHEMA_VERSION == 2
    assert all(t["raw"].startswith("ACTION: ") and "reply" not in t for t in rec["turns"])
    # A schema-1 record of a local model kept the same text as `reply`: readers take either.
    old = json.loads(json.dumps(rec))
    old["schema_version"] = 1
    for t in old["turns"]:
        t["reply"] = t.pop("raw")
    assert (
        [turn_raw(t) for t in old["turns"]] == [turn_raw(t) for t in rec["turns"]] == [t["raw"] for t in rec["turns"]]
    )
    scored = run(["dphil-score", "--shaped"], input=(json.dumps(old) + "\n" + json.dumps(rec) + "\n").encode())
    assert scored.returncode == 0, scored.stderr.decode()
    a, b = records(scored.stdout)
    assert a["reward"] == b["reward"]


@pytest.mark.parametrize("broken, code", [("empty", 66), ("bad-config", 65), ("bad-weights", 65)])
def test_a_model_directory_transformers_cannot_load_is_one_line(trained, tmp_path, broken, code):
    _, model, _ = trained
    bad = tmp_path / broken
    bad.mkdir()
    if broken == "bad-config":
        (bad / "config.json").write_text("{not json")
    if broken == "bad-weights":
        for p in Path(model).iterdir():
            if p.is_file():
                (bad / p.name).write_bytes(p.read_bytes())
        weights = next(bad.glob("*.safetensors"))
        weights.write_bytes(weights.read_bytes()[:100])
    proc = run(["dphil-rollout", "-m", f"hf:{bad}", *LOCAL])
    err = proc.stderr.decode()
    assert proc.returncode == code, err
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err
