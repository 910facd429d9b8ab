"""`dphil-rollout --tag KEY=VALUE`: a label on every episode that dphil-stats can compare by."""

from __future__ import annotations

import json

import pytest

from tests.support.commands import run


def episodes(*extra: str) -> list[dict]:
    proc = run(["dphil-rollout", "-q", "-m", "scripted:naive", "-n", "3", "--episodes", "3", *extra])
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.decode().splitlines()]


def test_a_tag_is_written_into_every_episode_and_its_id():
    plain, tagged = episodes(), episodes("--tag", "recipe=study", "--tag", "arm=a")
    assert all(e["recipe"] == "study" and e["arm"] == "a" for e in tagged)
    assert [e["seed"] for e in plain] == [e["seed"] for e in tagged]
    assert {e["episode_id"] for e in plain}.isdisjoint(e["episode_id"] for e in tagged)


def test_dphil_stats_compares_by_a_tag(tmp_path):
    path = tmp_path / "ep.jsonl"
    lines = []
    for recipe, model in (("study", "scripted:naive"), ("dphil", "scripted:hierarchy")):
        proc = run(["dphil-rollout", "-q", "-m", model, "-n", "3", "--episodes", "6", "--tag", f"recipe={recipe}"])
        assert proc.returncode == 0, proc.stderr
        lines.append(proc.stdout.decode())
    scored = run(["dphil-score", "-q", "-"], input="".join(lines).encode())
    path.write_bytes(scored.stdout)
    stats = run(["dphil-stats", "-q", str(path), "--by", "recipe,n", "--compare", "recipe", "study", "dphil"])
    assert stats.returncode == 0, stats.stderr
    records = [json.loads(line) for line in stats.stdout.decode().splitlines()]
    comparison = next(r for r in records if r["kind"] == "comparison")
    cells = {r["recipe"]: r for r in records if r["kind"] == "cell"}
    assert cells["study"]["deadlock_rate"] == 1.0 and cells["dphil"]["deadlock_rate"] == 0.0
    assert comparison["paired"] is True  # same seeds in both arms


@pytest.mark.parametrize(
    "tag,match",
    [
        ("recipe", "KEY=VALUE"),
        ("Recipe=x", "KEY=VALUE"),
        ("recipe=", "KEY=VALUE"),
        ("seed=3", "part of the episode record"),
        ("reward=x", "part of the episode record"),
    ],
)
def test_bad_tags_exit_64(tag, match):
    proc = run(["dphil-rollout", "-m", "scripted:naive", "-n", "3", "--episodes", "1", "--tag", tag])
    assert proc.returncode == 64 and match in proc.stderr.decode()


def test_a_tag_may_not_shadow_what_a_local_run_records(tmp_path):
    proc = run(["dphil-rollout", "-m", f"hf:{tmp_path}", "-n", "3", "--episodes", "1", "--tag", "memory=x"])
    assert proc.returncode == 64 and "already records" in proc.stderr.decode()
