"""dphil-stats --cluster: comparisons tested over training runs, not only over episodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from tests.results.test_stats_cli import pipeline, records, run, validate


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Real scored episodes; the `random` arm split into three "training runs" of 4, 4 and 6
    episodes, the `hierarchy` arm left without the field (as an untrained model's)."""
    eps = records(pipeline("-m", "scripted:hierarchy", "-m", "scripted:random", "-n", "5", "--episodes", "14"))
    lines = []
    k = 0
    for rec in eps:
        if rec["model"] == "scripted:random":
            rec["run"] = "r1" if k < 4 else "r2" if k < 8 else "r3"
            k += 1
        lines.append(json.dumps(rec) + "\n")
    path = tmp_path_factory.mktemp("cluster") / "ep.jsonl"
    path.write_text("".join(lines))
    return path


def _rewards(path: Path) -> tuple[list[float], dict[str, list[float]], dict[str, list[bool]]]:
    base, clusters, deadlocks = [], {}, {}
    for rec in map(json.loads, path.read_text().splitlines()):
        if rec["model"] == "scripted:hierarchy":
            base.append(rec["reward"]["total"])
        else:
            clusters.setdefault(rec["run"], []).append(rec["reward"]["total"])
            deadlocks.setdefault(rec["run"], []).append(rec["deadlock"])
    return base, clusters, deadlocks


def test_the_test_over_clusters_is_welch_on_the_cluster_means(runs):
    out = run([str(runs), "--compare", "model", "scripted:hierarchy", "scripted:random", "--cluster", "run", "-q"])
    assert out.returncode == 0, out.stderr
    recs = records(out.stdout)
    validate(recs)
    (comp,) = [r for r in recs if r["kind"] == "comparison"]
    cl = comp["clustered"]
    base, clusters, deadlocks = _rewards(runs)
    means = [float(np.mean(v)) for v in clusters.values()]
    expected = st.ttest_ind(means, base, equal_var=False)  # B − A: the clusters minus the episodes
    assert (cl["field"], cl["a_units"], cl["b_units"]) == ("run", 14, 3)
    assert cl["diff"] == pytest.approx(np.mean(means) - np.mean(base))
    assert cl["t"] == pytest.approx(expected.statistic)
    assert cl["p_value"] == pytest.approx(expected.pvalue)
    rates = [float(np.mean(v)) for v in deadlocks.values()]
    assert cl["deadlock"]["diff"] == pytest.approx(np.mean(rates) - 0.0)
    # the per-episode test still reads every episode
    assert (comp["a"]["episodes"], comp["b"]["episodes"]) == (14, 14)
    assert cl["p_value"] > comp["p_value"]  # three runs carry less evidence than fourteen episodes


def test_the_markdown_table_shows_the_units_and_their_p(runs):
    out = run(
        [
            str(runs),
            "--no-cells",
            "--compare",
            "model",
            "scripted:hierarchy",
            "scripted:random",
            "--cluster",
            "run",
            "--format",
            "markdown",
            "-q",
        ]
    )
    assert out.returncode == 0, out.stderr
    header, _, row = out.stdout.decode().splitlines()[:3]
    assert "units A/B (run)" in header and "p over units (holm)" in header
    assert "| 14/3 |" in row


def test_an_arm_that_mixes_runs_and_loose_episodes_has_no_cluster_test(runs, tmp_path):
    lines = runs.read_text().splitlines()
    mixed = []
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec["model"] == "scripted:random" and rec["run"] == "r3" and i % 2:
            del rec["run"]
        mixed.append(json.dumps(rec) + "\n")
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(mixed))
    out = run([str(path), "--compare", "model", "scripted:hierarchy", "scripted:random", "--cluster", "run", "-q"])
    assert out.returncode == 0, out.stderr
    (comp,) = [r for r in records(out.stdout) if r["kind"] == "comparison"]
    assert comp["clustered"]["p_value"] is None and comp["clustered"]["b_units"] is None
    assert any("mixes episodes with and without run" in n for n in comp["notes"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cluster", "run"], "give --compare too"),
        (
            ["--by", "model,run", "--compare", "model", "scripted:hierarchy", "scripted:random", "--cluster", "run"],
            "--by",
        ),
        (
            ["--compare", "model", "scripted:hierarchy", "scripted:random", "--cluster", "nosuchfield"],
            "no episode has a field 'nosuchfield' (--cluster): cluster by",
        ),
        (["--compare", "modle", "a", "b"], "no episode has a field 'modle' (--compare): group by"),
        (["--compare", "model", "scripted:hierarchy", "scripted:random", "--cluster", "turns"], "turns"),
    ],
)
def test_a_bad_cluster_is_a_usage_error(runs, args, says):
    out = run([str(runs), *args])
    assert out.returncode == 64, out.stderr
    err = out.stderr.decode()
    assert says in err and len(err.strip().splitlines()) == 1


def test_clustering_leaves_the_cells_as_they_were(runs):
    """The cluster field is read for the arms only: every cell record is what it is without it."""
    compare = ["--compare", "model", "scripted:hierarchy", "scripted:random", "-q"]
    plain, clustered = run([str(runs), *compare]), run([str(runs), *compare, "--cluster", "run"])
    assert plain.returncode == clustered.returncode == 0, clustered.stderr

    def cells(out):
        return [r for r in records(out.stdout) if r["kind"] == "cell"]

    assert cells(clustered) == cells(plain) and len(cells(plain)) == 2


def test_two_units_are_said_to_have_little_power(runs, tmp_path):
    two = []
    for line in runs.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("run") == "r3":
            rec["run"] = "r2"
        two.append(json.dumps(rec) + "\n")
    path = tmp_path / "two.jsonl"
    path.write_text("".join(two))
    out = run([str(path), "--compare", "model", "scripted:hierarchy", "scripted:random", "--cluster", "run", "-q"])
    (comp,) = [r for r in records(out.stdout) if r["kind"] == "comparison"]
    assert comp["clustered"]["b_units"] == 2 and comp["clustered"]["df"] is not None
    assert any("2 units of run" in n for n in comp["notes"])
