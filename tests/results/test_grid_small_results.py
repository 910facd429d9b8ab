"""The committed small-scale grid reads as one episode per id: retried errors are left out, others kept.

`bench/grid_small.py --report` gives dphil-score and dphil-stats each journal without the errored
attempts that `--resume` later completed (dphil-stats refuses an episode read twice); an error
that was never retried stays and is counted as an error.
"""

from __future__ import annotations

import json
import subprocess

from dphil.io.console_scripts import locate
from tests.support.commands import ROOT, load_script

GRID = ROOT / "bench" / "results" / "grid_small" / "episodes"


def grid_small():
    return load_script("bench/grid_small.py")


def test_a_retried_error_is_left_out_and_a_lone_one_kept(tmp_path):
    journal = tmp_path / "part.jsonl"
    records = [
        {"episode_id": "a", "status": "error", "error": "timeout"},
        {"episode_id": "b", "status": "complete"},
        {"episode_id": "c", "status": "error", "error": "timeout"},
        {"episode_id": "a", "status": "complete"},
    ]
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "views").mkdir()
    view = grid_small()._retried_view(journal, tmp_path / "views")
    kept = [json.loads(line) for line in view.read_text().splitlines()]
    assert [(r["episode_id"], r["status"]) for r in kept] == [("b", "complete"), ("c", "error"), ("a", "complete")]
    assert journal.read_text().count("\n") == 4  # the journal itself is untouched


def test_the_committed_grid_reads_each_episode_once(tmp_path):
    module = grid_small()
    views = [module._retried_view(j, tmp_path) for j in sorted(GRID.glob("*.jsonl"))]
    score = subprocess.run([locate("dphil-score"), "--shaped", *map(str, views)], capture_output=True, check=True)
    scored = tmp_path / "scored.jsonl"
    scored.write_bytes(score.stdout)
    stats = subprocess.run([locate("dphil-stats"), str(scored), "--by", "part,n", "-q"], capture_output=True, text=True)
    assert stats.returncode == 0, stats.stderr
    cells = {(r["part"], r["n"]): r for r in map(json.loads, stats.stdout.splitlines()) if r["kind"] == "cell"}
    # Three resource-ordering episodes timed out once and were retried to completion.
    assert cells[("abl-resource-ordering", 5)]["episodes"] == 10
    assert cells[("abl-resource-ordering", 5)]["errors"] == 0
