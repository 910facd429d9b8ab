"""`-o` naming a device or a FIFO (`-o /dev/null`, a named pipe) writes into it in place.

Renaming a finished temporary file over such a target would replace the device or pipe
itself: run as root, `-o /dev/null` used to leave a plain file at /dev/null for every
process on the machine. A FIFO stands in for the device here, so a regression cannot do that.
"""

from __future__ import annotations

import os
import stat
import subprocess

from tests.support.commands import command_path, run


def test_score_into_a_fifo_writes_through_it_and_leaves_it_a_fifo(tmp_path):
    episodes = run(["dphil-rollout", "-q", "-m", "scripted:hierarchy", "-n", "5", "--episodes", "20"]).stdout
    expected = run(["dphil-score", "-q", "--shaped"], input=episodes).stdout
    fifo = tmp_path / "scored.pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        score = subprocess.run(
            [command_path("dphil-score"), "-q", "--shaped", "-o", str(fifo)],
            input=episodes,
            capture_output=True,
            timeout=120,
        )
        received, _ = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert score.returncode == 0, score.stderr
    assert received == expected and len(expected.splitlines()) == 20
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scored.pipe"]  # no temporary or lock file left


def test_stats_table_into_a_fifo(tmp_path):
    episodes = run(["dphil-rollout", "-q", "-m", "scripted:naive", "-n", "5", "--episodes", "10"]).stdout
    scored = tmp_path / "ep.jsonl"
    scored.write_bytes(run(["dphil-score", "-q"], input=episodes).stdout)
    expected = run(["dphil-stats", str(scored), "--format", "markdown"]).stdout
    fifo = tmp_path / "table.pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    try:
        stats = run(["dphil-stats", str(scored), "--format", "markdown", "-o", str(fifo)])
        received, _ = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert stats.returncode == 0, stats.stderr
    assert received == expected and b"|" in expected
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
