"""One writer per output: the lock beside every -o FILE (and dphil-train's run directory),
held by real processes, waited for, killed, and raced by identical cron-style writers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from dphil.io.lock import LockBusy, LockUnavailable, OutputLock, lock_path, locked
from tests.support.commands import command_path, run
from tests.support.openai_server import OpenAIServer

HOLDER = textwrap.dedent("""
    import sys, threading
    from dphil.io.lock import OutputLock
    lock = OutputLock(sys.argv[1]); lock.acquire()
    print("locked", flush=True)
    threading.Event().wait()
""")


@pytest.fixture
def holder():
    """Start a separate process that takes a lock and keeps it until killed."""
    procs = []

    def start(target):
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(target)], stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout.readline() == b"locked\n"  # an event, not a sleep
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def lines(path):
    with open(path, "rb") as fh:
        data = fh.read()
    assert not data or data.endswith(b"\n"), "torn last line"
    return [json.loads(x) for x in data.splitlines()]


def test_a_second_taker_is_told_the_holders_pid(tmp_path, holder):
    target = tmp_path / "out.jsonl"
    proc = holder(target)
    assert lock_path(target).read_text().strip() == str(proc.pid)
    with pytest.raises(LockBusy) as info:
        OutputLock(target).acquire()
    assert info.value.exit_code == 75
    assert str(target) in info.value.message and f"pid {proc.pid}" in info.value.message


def test_a_killed_holder_never_blocks(tmp_path, holder):
    target = tmp_path / "out.jsonl"
    proc = holder(target)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert lock_path(target).exists()  # left behind by the killed process, with its pid
    with locked([target]) as held:
        assert held[0].held
        assert lock_path(target).read_text().strip() == str(os.getpid())
    assert not lock_path(target).exists()  # a finished holder cleans up


def test_stdout_and_dash_need_no_lock(tmp_path):
    with locked([None, "-"]) as held:
        assert held == []


def test_lock_file_that_cannot_be_created_is_exit_73(tmp_path):
    (tmp_path / "a-file").write_text("")
    impossible = tmp_path / "a-file" / "out.jsonl"  # its directory cannot be made: a file is in the way
    with pytest.raises(LockUnavailable) as info:
        OutputLock(impossible).acquire()
    assert info.value.exit_code == 73 and str(impossible) in info.value.message


def test_a_missing_directory_is_created_for_the_lock(tmp_path):
    target = tmp_path / "runs" / "a" / "out.jsonl"
    with OutputLock(target):
        assert target.parent.is_dir()


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody may create files in: mode 0555, or for root (who ignores modes) a
    read-only tmpfs mounted there."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "dphil-ro", str(ro)], capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only tmpfs: {p.stderr!r}")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_read_only_directory_exits_73_with_a_line(tmp_path, read_only_dir):
    src = tmp_path / "ep.jsonl"
    subprocess.run(
        [command_path("dphil-rollout"), "-m", "scripted:naive", "-n", "3", "--episodes", "1", "-o", str(src)],
        check=True,
    )
    for argv in (["dphil-score", str(src)], ["dphil-rollout", "-m", "scripted:naive"]):
        out = str(read_only_dir / "out.jsonl")
        p = run([*argv, "-o", out])
        assert p.returncode == 73, p.stderr
        (line,) = p.stderr.decode().splitlines()
        assert line.startswith(f"{argv[0]}: ") and out in line and "lock file" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["dphil-score", "{src}", "-o", "{out}"],
        ["dphil-stats", "{src}", "-o", "{out}"],
        ["dphil-ckpt-select", "{src}", "-o", "{out}"],
        ["dphil-rollout", "-m", "scripted:naive", "-n", "3", "-o", "{out}", "--resume"],
        ["dphil-train", "--base-model", "none", "--run-dir", "{out}"],
    ],
)
def test_every_writer_exits_75_naming_the_file_and_holder(tmp_path, holder, argv):
    out = tmp_path / "target"
    src = tmp_path / "in.jsonl"
    src.write_text("")
    proc = holder(out)
    p = run([a.format(src=src, out=out) for a in argv])
    assert p.returncode == 75, p.stderr
    (line,) = p.stderr.decode().splitlines()
    assert str(out) in line and f"pid {proc.pid}" in line and "--wait-lock" in line
    assert p.stdout == b"" and not (tmp_path / "target").exists()


def test_wait_lock_waits_for_the_holder_then_writes(tmp_path, holder):
    src = tmp_path / "ep.jsonl"
    subprocess.run(
        [command_path("dphil-rollout"), "-m", "scripted:hierarchy", "-n", "3", "--episodes", "4", "-o", str(src)],
        check=True,
    )
    out = tmp_path / "scored.jsonl"
    proc = holder(out)
    waiter = subprocess.Popen(
        [command_path("dphil-score"), str(src), "-o", str(out), "--wait-lock", "120"], stderr=subprocess.PIPE
    )
    first = waiter.stderr.readline().decode()  # the waiter says it waits: now let go
    assert f"waiting up to 120 s for pid {proc.pid}" in first and str(out) in first
    assert not out.exists()
    proc.kill()
    proc.wait()
    _, rest = waiter.communicate(timeout=300)
    assert waiter.returncode == 0, rest
    assert len(lines(out)) == 4 and not lock_path(out).exists()


def test_wait_lock_gives_up_after_its_time(tmp_path, holder):
    proc = holder(tmp_path / "out.jsonl")
    p = run(["dphil-score", os.devnull, "-o", str(tmp_path / "out.jsonl"), "--wait-lock", "0.2", "-q"])
    assert p.returncode == 75
    assert b"after waiting 0.2 s" in p.stderr and str(proc.pid).encode() in p.stderr


def _registry(tmp_path, server):
    path = tmp_path / "models.toml"
    path.write_text(
        f'[models.local]\nmodel = "openai/local"\napi_base = "{server.url}"\napi_key_env = "DPHIL_LOCK_KEY"\n'
    )
    return str(path)


def test_identical_writers_some_killed_leave_every_episode_once(tmp_path):
    """Four cron-style `--resume` writers of one journal at once; the writer holding the lock is
    SIGKILLed twice while its model call is held by the server; then one more --resume."""
    env = {**os.environ, "DPHIL_LOCK_KEY": "sk-lock-0123456789"}
    env.pop("DPHIL_MODELS", None)
    out = tmp_path / "out.jsonl"
    with OpenAIServer() as server:
        args = [
            command_path("dphil-rollout"),
            "-m",
            "local",
            "-n",
            "2",
            "--episodes",
            "8",
            "--rounds",
            "1",
            "--models",
            _registry(tmp_path, server),
            "--concurrency",
            "1",
            "-o",
            str(out),
            "--resume",
            "--wait-lock",
            "300",
            "-q",
        ]
        served = 6  # three episodes of two calls each, then the next call is held
        server.hold_after(served)
        writers = [subprocess.Popen(args, env=env, stderr=subprocess.PIPE) for _ in range(4)]
        by_pid = {w.pid: w for w in writers}
        killed = []
        try:
            for k in range(2):
                assert server.wait_arrived(served + 1 + k), "no writer reached the held call"
                pid = int(lock_path(out).read_text())
                by_pid[pid].send_signal(signal.SIGKILL)
                by_pid[pid].wait()
                killed.append(pid)
            assert len(lines(out)) == 3  # the killed writers' held episodes left no trace
            server.release()
            codes = {w.pid: w.wait(timeout=300) for w in writers}
        finally:
            for w in writers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
        assert sorted(codes[p] for p in killed) == [-9, -9]
        assert all(code == 0 for pid, code in codes.items() if pid not in killed), codes
        p = subprocess.run(args, env=env, capture_output=True)
        assert p.returncode == 0, p.stderr
    records = lines(out)
    ids = [r["episode_id"] for r in records]
    assert len(ids) == len(set(ids)) == 8  # every episode exactly once
    assert all(r["status"] == "complete" for r in records)
    assert not lock_path(out).exists()


def test_identical_scripted_writers_started_at_once(tmp_path):
    out = tmp_path / "grid.jsonl"
    args = [
        command_path("dphil-rollout"),
        "-m",
        "scripted:random",
        "-n",
        "5,10",
        "--episodes",
        "300",
        "-o",
        str(out),
        "--resume",
        "-q",
    ]
    writers = [subprocess.Popen(args, stderr=subprocess.PIPE) for _ in range(4)]
    results = [(w.wait(timeout=300), w.stderr.read()) for w in writers]
    for code, err in results:  # each either wrote (or found nothing to do) or was refused
        assert code in (0, 75), err
        if code == 75:
            assert b"being written by pid" in err
    subprocess.run(args, check=True)
    ids = [r["episode_id"] for r in lines(out)]
    assert len(ids) == len(set(ids)) == 600


def test_a_device_or_fifo_output_takes_no_lock(tmp_path):
    fifo = tmp_path / "out.pipe"
    os.mkfifo(fifo)
    plain = tmp_path / "out.jsonl"
    with locked([fifo, plain, "/dev/null"]) as held:
        assert [lock.target for lock in held] == [str(plain)]
        assert not lock_path(fifo).exists() and not lock_path("/dev/null").exists()
        assert lock_path(plain).exists()
