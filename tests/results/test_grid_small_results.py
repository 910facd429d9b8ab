"""The committed small-scale grid reads as one episode per id, with its journals as they are.

`bench/grid_small.py --resume` retried three resource-ordering episodes that had timed out; the
errored attempts stay in the journal as a record of what happened, and dphil-stats leaves them out
(a complete record of the same episode supersedes them) and says so, so each episode counts once.
"""

from __future__ import annotations

import json
import subprocess

from dphil.io.console_scripts import locate
from tests.support.commands import ROOT

GRID = ROOT / "bench" / "results" / "grid_small" / "episodes"


def test_the_committed_grid_reads_each_episode_once(tmp_path):
    journals = sorted(GRID.glob("*.jsonl"))
    score = subprocess.run([locate("dphil-score"), "--shaped", *map(str, journals)], capture_output=True, check=True)
    scored = tmp_path / "scored.jsonl"
    scored.write_bytes(score.stdout)
    stats = subprocess.run([locate("dphil-stats"), str(scored), "--by", "part,n", "-q"], capture_output=True, text=True)
    assert stats.returncode == 0, stats.stderr
    assert "left out 3 errored attempt(s) of episodes read again" in stats.stderr
    cells = {(r["part"], r["n"]): r for r in map(json.loads, stats.stdout.splitlines()) if r["kind"] == "cell"}
    assert cells[("abl-resource-ordering", 5)]["episodes"] == 10
    assert cells[("abl-resource-ordering", 5)]["errors"] == 0
    # The grid as the issue asks for it: every model and baseline at N = 5, 10 and 15, and the
    # ablations at N = 5, each with at least 10 complete episodes.
    parts = ("random", "naive", "hierarchy", "idle", "q05-tools", "q05-text", "q15-tools", "q15-text", "gemma-text")
    for part in parts:
        for n in (5, 10, 15):
            assert cells[(part, n)]["episodes"] >= 10, (part, n)
    for part in ("abl-resource-ordering", "abl-symmetry-breaking", "abl-talk1"):
        assert cells[(part, 5)]["episodes"] >= 10, part
    assert all(c["errors"] == 0 for c in cells.values())
