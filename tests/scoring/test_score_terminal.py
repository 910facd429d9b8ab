"""On a terminal, a scored run ends with its summary table and says where it wrote; in a pipe it is silent."""

from __future__ import annotations

import os
import pty
import subprocess

from tests.support.commands import command_path, run


def scripted_episodes() -> bytes:
    p = run(["dphil-rollout", "-m", "scripted:naive", "-m", "scripted:idle", "-n", "5", "--episodes", "3"])
    assert p.returncode == 0
    return p.stdout


def on_a_terminal(args: list[str], stdin: bytes) -> tuple[int, bytes, str]:
    """Run with stderr on a real pseudo-terminal; (exit status, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out, _ = proc.communicate(stdin, timeout=120)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return proc.returncode, out, shown.decode().replace("\r\n", "\n")


def test_a_terminal_gets_the_summary_table_and_where_the_records_went():
    code, out, shown = on_a_terminal([command_path("dphil-score"), "--shaped"], scripted_episodes())
    assert code == 0 and len(out.splitlines()) == 6
    lines = shown.splitlines()
    assert lines[0].split()[:3] == ["model", "N", "episodes"] and "reward (shaped)" in lines[0]
    assert lines[1].split() == ["scripted:idle", "5", "3", "0", "0%", "0.00", "0%", "-0.100"]
    assert lines[-1] == "dphil-score: wrote 6 scored episode(s) to stdout"


def test_quiet_or_a_pipe_gets_no_summary():
    code, _, shown = on_a_terminal([command_path("dphil-score"), "--shaped", "-q"], scripted_episodes())
    assert code == 0 and shown == ""
    piped = run(["dphil-score", "--shaped"], input=scripted_episodes())
    assert piped.returncode == 0 and piped.stderr == b""
