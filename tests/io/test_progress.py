"""Progress in logs: on a stderr that is not a terminal, a plain line every N seconds."""

from __future__ import annotations

import io
import os
import re
import time

from dphil.io.console import Console
from dphil.io.progress import LogProgress, make_progress
from tests.support.commands import run


def test_a_log_gets_a_line_per_interval_with_done_rate_and_eta():
    stream = io.StringIO()
    p = LogProgress("dphil-rollout", 10, unit="episodes", stream=stream, interval=0.05)
    p.update(4)
    p.set_postfix(errors=1)
    deadline = time.monotonic() + 5
    while "4/10" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    p.close()
    line = stream.getvalue().splitlines()[0]
    assert line.startswith("dphil-rollout: 4/10 episodes (40%), errors 1, ")
    assert re.search(r"episodes/s, ETA \d+s, elapsed \d+s$", line)


def test_no_progress_when_quiet_and_a_bar_only_on_a_terminal():
    assert make_progress(Console("x", quiet=True, stderr=io.StringIO()), 5, unit="episodes") is None
    log = make_progress(Console("x", stderr=io.StringIO()), 5, unit="episodes")
    assert isinstance(log, LogProgress)
    log.close()


def test_rollout_writes_progress_lines_into_a_log_and_none_with_q():
    env = {**os.environ, "DPHIL_PROGRESS_SECONDS": "0.1"}
    args = ["dphil-rollout", "-m", "scripted:random", "-n", "5,10,15", "--episodes", "4000", "--rounds", "20"]
    p = run(args, env=env)
    assert p.returncode == 0
    lines = p.stderr.decode().splitlines()
    assert lines and all(re.match(r"dphil-rollout: \d+/12000 episodes \(\d+%\), ", x) for x in lines)
    q = run([*args, "-q"], env=env)
    assert q.returncode == 0 and q.stderr == b""
