"""`dphil-rollout -m hf:PATH`: --max-new-tokens reaches the decision, and every turn records latency_s.

Runs the real command on a tiny random Qwen3 built in the test (no download, no training).
"""

from __future__ import annotations

import json

import pytest

from dphil.local.entries import LocalSettings
from tests.support.commands import run

pytest.importorskip("torch")
pytest.importorskip("peft")

LOCAL = ["-n", "3", "--rounds", "2", "--memory", "none", "--threads", "1"]


@pytest.fixture(scope="module")
def local(tiny, prompt_file):
    """(the tiny model, the short prompt file): what every run here plays with."""
    return tiny, prompt_file


_RUNS: dict[tuple[str, ...], list[dict]] = {}


def rollout(local, *args: str) -> list[dict]:
    """The episodes of one run (each run once per module: every run loads torch and the model)."""
    if args not in _RUNS:
        model, prompt = local
        command = ["dphil-rollout", "-q", "-m", f"hf:{model}", "--prompt-file", str(prompt), *LOCAL, *args]
        proc = run(command, timeout=300)
        assert proc.returncode == 0, proc.stderr.decode()
        _RUNS[args] = [json.loads(x) for x in proc.stdout.splitlines()]
    return json.loads(json.dumps(_RUNS[args]))


def test_max_new_tokens_bounds_free_replies_and_enters_the_id(local):
    short = rollout(local, "--decode", "free", "--max-new-tokens", "3", "--seeds", "4")
    (rec,) = short
    turns = rec["turns"]
    assert turns and all(t["completion_tokens"] <= 3 for t in turns)
    # A random model rarely stops by itself within 3 tokens: the cut is recorded.
    assert any(t.get("truncated") for t in turns)
    assert rec["max_new_tokens"] == 3
    assert all(isinstance(t["latency_s"], float) and t["latency_s"] >= 0 for t in turns)
    default = rollout(local, "--decode", "free", "--seeds", "4")
    assert "max_new_tokens" not in default[0] and default[0]["episode_id"] != rec["episode_id"]
    assert all(t["completion_tokens"] <= 48 for t in default[0]["turns"])


def test_the_default_and_constrained_decoding_keep_the_ids_of_earlier_runs(local):
    # Episodes recorded before --max-new-tokens existed were played with 48 and have no such
    # field in their id: the default must keep those ids, and so must constrained decoding,
    # which generates no text whatever the bound.
    plain = LocalSettings(prompt_file=str(local[1]), decode="free")
    assert set(plain.variant()) == {"prompt", "prompt_version", "memory", "decode", "temperature"}
    assert (
        LocalSettings(prompt_file=str(local[1]), max_new_tokens=5).variant()
        == LocalSettings(prompt_file=str(local[1])).variant()
    )
    assert LocalSettings(prompt_file=str(local[1]), decode="free", max_new_tokens=5).variant()["max_new_tokens"] == 5
    ids = {
        tuple(r["episode_id"] for r in rollout(local, "--seeds", "4,5", *extra))
        for extra in ([], ["--max-new-tokens", "3"])
    }
    assert len(ids) == 1
    assert not any("max_new_tokens" in r for r in rollout(local, "--seeds", "4,5", "--max-new-tokens", "3"))
    free = {
        tuple(r["episode_id"] for r in rollout(local, "--decode", "free", "--seeds", "4", *extra))
        for extra in ([], ["--max-new-tokens", "48"])
    }
    assert len(free) == 1


@pytest.mark.parametrize("schedule", ["simultaneous", "sequential"])
def test_every_turn_records_the_wall_time_of_its_batched_decision(local, schedule):
    recs = rollout(local, "--seeds", "4,5", *(["--schedule", schedule] if schedule == "sequential" else []))
    assert len(recs) == 2
    turns = [t for r in recs for t in r["turns"]]
    assert turns and all(isinstance(t["latency_s"], float) and t["latency_s"] >= 0 for t in turns)
    if schedule == "simultaneous":
        # Round 1 of both tables was one batched call: its turns share its wall time.
        first = {t["latency_s"] for t in turns if t["round"] == 1}
        assert len(first) == 1


def test_max_new_tokens_is_checked():
    model_free = ["dphil-rollout", "-m", "hf:/nonexistent", "--max-new-tokens", "0"]
    proc = run(model_free)
    assert proc.returncode == 64 and b"--max-new-tokens" in proc.stderr
