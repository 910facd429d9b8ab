"""samples/cron/crontab's line, run the way cron runs it: `/bin/sh -c` in cron's bare environment.

Overlapping runs must not duplicate episodes (the second finds the output locked and exits 75),
a run killed with SIGKILL loses nothing that a rerun cannot finish, and a rerun of a complete
grid writes nothing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

from tests.support.commands import ROOT, run

CRONTAB = ROOT / "samples" / "cron" / "crontab"
VENV = Path(sys.executable).parent.parent
WAIT_SECONDS = 120  # a bound on waiting, not a timing assumption
# 80,000 short episodes (about 43 MB): the first run is caught after its first lines, long before its last.
GRID = "-m scripted:random -n 2 --rounds 1 --episodes 80000"


def cron_entry(text: str) -> tuple[dict[str, str], str]:
    """The variables a crontab sets and the command of its one job line, as cron reads them."""
    env, commands = {}, []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assignment = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", line)
        if assignment:
            name, value = assignment.groups()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[name] = value
        else:
            commands.append(line.split(None, 5)[5])
    assert len(commands) == 1, commands
    assert "%" not in commands[0]  # cron would turn it into a newline
    return env, commands[0]


def test_the_cron_line_resumes_refuses_to_overlap_and_survives_sigkill(tmp_path):
    crontab_env, command = cron_entry(CRONTAB.read_text())
    assert {"DPHIL", "DPHIL_VENV", "GRID_DIR", "GRID"} <= crontab_env.keys()
    home = tmp_path / "home"
    home.mkdir()
    grid_dir = tmp_path / "grid"
    grid_dir.mkdir()
    # Cron's own environment (Debian's cron: SHELL, PATH, HOME, LOGNAME), then the crontab's
    # variables with this checkout, this venv, a scratch directory and a scripted grid.
    env = {
        "SHELL": "/bin/sh",
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "LOGNAME": "root",
        **crontab_env,
        "DPHIL": str(ROOT),
        "DPHIL_VENV": str(VENV),
        "GRID_DIR": str(grid_dir),
        "GRID": GRID,
    }

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=home,
            env=env,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def finish(proc: subprocess.Popen) -> tuple[int, bytes]:
        out, _ = proc.communicate(timeout=WAIT_SECONDS)
        return proc.returncode, out

    out = grid_dir / "grid.jsonl"
    log = grid_dir / "grid.log"
    expected = Counter(
        orjson.loads(line)["episode_id"] for line in run(["dphil-rollout", "-q", *GRID.split()]).stdout.splitlines()
    )
    assert len(expected) == 80000

    first = start()
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (out.exists() and b"\n" in out.read_bytes()[: 1 << 20]):
            assert first.poll() is None, f"the first run ended before writing: {log.read_text()}"
            assert time.monotonic() < deadline, "the first run wrote nothing"
            time.sleep(0.01)
        os.killpg(first.pid, signal.SIGSTOP)  # holds the lock, mid-grid, until we kill it
        assert first.poll() is None, "the first run finished before it could be overlapped"

        # An overlapping run: exits at once with 75, writes no episode, says why in the log.
        size = out.stat().st_size
        status, printed = finish(start())
        assert (status, printed) == (75, b"")  # cron would mail any output; there is none
        assert out.stat().st_size == size
        assert "being written by pid" in log.read_text()

        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=WAIT_SECONDS)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    killed_at = len(out.read_bytes().splitlines())
    assert 0 < killed_at < 80000

    # The next scheduled run finishes the grid; the one after has nothing left to do.
    assert finish(start()) == (0, b"")
    done = out.read_bytes()
    assert finish(start()) == (0, b"")
    assert out.read_bytes() == done
    assert done.endswith(b"\n")
    lines = done.splitlines()
    ids = Counter(orjson.loads(line)["episode_id"] for line in lines)
    assert ids == expected  # every episode of the grid, each exactly once
    text = log.read_text()
    assert text.count(" start pid ") == 4
    assert "80000 episode(s) already complete" in text
