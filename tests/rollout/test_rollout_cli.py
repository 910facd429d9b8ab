"""dphil-rollout with built-in policies: grid, seeds, ids, shards, resume, signals, errors."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from click.testing import CliRunner
from dphil.commands.rollout import main as rollout_main

from tests.support.commands import command_path, run


def records(out: str | bytes) -> list[dict]:
    return [json.loads(x) for x in out.splitlines()]


def test_grid_of_models_sizes_and_seeds():
    res = CliRunner().invoke(
        rollout_main,
        ["-m", "scripted:hierarchy", "-m", "scripted:random", "-n", "5,10", "--episodes", "3", "--seed", "100"],
    )
    assert res.exit_code == 0, res.output
    recs = records(res.stdout)
    assert [(r["model"], r["n"], r["seed"]) for r in recs] == [
        (m, n, s) for m in ("scripted:hierarchy", "scripted:random") for n in (5, 10) for s in (100, 101, 102)
    ]
    assert all(
        r["rounds"] == 5
        and r["protocol"] == "paper"
        and r["schedule"] == "simultaneous"
        and r["conflict"] == "random"
        and r["deadlock_mode"] == "terminal"
        for r in recs
    )
    assert len({r["episode_id"] for r in recs}) == len(recs)


def test_options_reach_the_records():
    res = CliRunner().invoke(
        rollout_main,
        [
            "-m",
            "scripted:random",
            "-n",
            "3",
            "--seeds",
            "7,9-10",
            "--rounds",
            "4",
            "--protocol",
            "dpbench",
            "--schedule",
            "sequential",
            "--conflict",
            "lowest-id",
            "--deadlock",
            "continue",
        ],
    )
    recs = records(res.stdout)
    assert [r["seed"] for r in recs] == [7, 9, 10]
    assert {(r["rounds"], r["protocol"], r["schedule"], r["conflict"], r["deadlock_mode"]) for r in recs} == {
        (4, "dpbench", "sequential", "lowest-id", "continue")
    }
    assert all(len(r["turns"]) == 12 for r in recs)


def test_episode_ids_are_stable_across_runs_and_change_with_config():
    a = records(CliRunner().invoke(rollout_main, ["-m", "scripted:random", "--episodes", "4"]).stdout)
    b = records(CliRunner().invoke(rollout_main, ["-m", "scripted:random", "--episodes", "4"]).stdout)
    c = records(CliRunner().invoke(rollout_main, ["-m", "scripted:random", "--episodes", "4", "--rounds", "6"]).stdout)
    assert a == b
    assert {r["episode_id"] for r in a}.isdisjoint({r["episode_id"] for r in c})


def test_shards_partition_the_grid():
    args = ["-m", "scripted:random", "-m", "scripted:naive", "-n", "3,5", "--episodes", "7"]
    full = records(CliRunner().invoke(rollout_main, args).stdout)
    parts = [records(CliRunner().invoke(rollout_main, [*args, "--shard", f"{i}/3"]).stdout) for i in range(3)]
    ids = [r["episode_id"] for p in parts for r in p]
    assert sorted(ids) == sorted(r["episode_id"] for r in full) and len(set(ids)) == len(ids)
    by_id = {r["episode_id"]: r for r in full}
    assert all(by_id[r["episode_id"]] == r for p in parts for r in p)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "scripted:smart"], "unknown scripted policy"),
        (["-m", "scripted:naive", "-n", "1"], "at least 2"),
        (["-m", "scripted:naive", "-n", "five"], "not a non-negative integer"),
        (["-m", "scripted:naive", "--seeds", "9-3"], "runs backwards"),
        (["-m", "scripted:naive", "--shard", "3/3"], "0 <= i < k"),
        (["-m", "scripted:naive", "--resume"], "--resume needs -o"),
        (["-m", "scripted:naive", "--protocol", "chess"], "Invalid value"),
        ([], "Missing option"),
    ],
)
def test_usage_errors_exit_64(args, message):
    proc = run(["dphil-rollout", *args])
    assert proc.returncode == 64, proc.stderr
    assert message in proc.stderr.decode()
    assert proc.stdout == b""


def test_existing_output_needs_resume(tmp_path):
    out = tmp_path / "grid.jsonl"
    assert run(["dphil-rollout", "-m", "scripted:naive", "--episodes", "2", "-o", str(out)]).returncode == 0
    before = out.read_bytes()
    proc = run(["dphil-rollout", "-m", "scripted:naive", "--episodes", "2", "-o", str(out)])
    assert proc.returncode == 73 and b"--resume" in proc.stderr
    assert out.read_bytes() == before


def test_resume_finishes_the_grid_then_does_nothing(tmp_path):
    out = tmp_path / "grid.jsonl"
    args = ["dphil-rollout", "-m", "scripted:random", "-n", "5,10", "--episodes", "20", "-o", str(out), "--resume"]
    full = records(run(["dphil-rollout", "-m", "scripted:random", "-n", "5,10", "--episodes", "20"]).stdout)
    first = run([*args[:6], "10", *args[7:]])  # half the seeds first
    assert first.returncode == 0
    assert len(records(out.read_bytes())) == 20
    second = run(args)
    assert second.returncode == 0
    assert b"20 episode(s) already complete" in second.stderr
    got = records(out.read_bytes())
    assert sorted(r["episode_id"] for r in got) == sorted(r["episode_id"] for r in full)
    size = out.stat().st_size
    third = run(args)
    assert third.returncode == 0 and out.stat().st_size == size  # cron rerun: nothing to do


def test_resume_reruns_errored_episodes_and_repairs_a_torn_line(tmp_path):
    out = tmp_path / "grid.jsonl"
    assert run(["dphil-rollout", "-m", "scripted:hierarchy", "--episodes", "3", "-o", str(out)]).returncode == 0
    recs = records(out.read_bytes())
    recs[1]["status"] = "error"
    out.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in recs) + b'{"kind": "episo')
    proc = run(["dphil-rollout", "-m", "scripted:hierarchy", "--episodes", "3", "-o", str(out), "--resume"])
    assert proc.returncode == 0, proc.stderr
    assert b"torn last line" in proc.stderr
    got = records(out.read_bytes())
    assert [r["status"] for r in got] == ["complete", "error", "complete", "complete"]
    assert got[3]["episode_id"] == recs[1]["episode_id"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_whole_lines_and_resume_completes(tmp_path, sig):
    out = tmp_path / "grid.jsonl"
    args = [command_path("dphil-rollout"), "-m", "scripted:random", "-n", "5,50,200", "--episodes", "400"]
    # The grid (about 30 MB) cannot finish while nobody reads its pipe, so the signal always
    # arrives mid-run, however fast or busy the machine is; often during a part-done write.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    head = b""
    while len(head) < 200_000:  # unbuffered, so communicate() below gets every later byte
        head += proc.stdout.read(200_000 - len(head))
    proc.send_signal(sig)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), err
    data = head + rest
    assert data.endswith(b"\n")
    partial = records(data)
    assert 0 < len(partial) < 1200
    out.write_bytes(data)
    rerun = subprocess.run([*args, "-o", str(out), "--resume"], capture_output=True, timeout=300)
    assert rerun.returncode == 0
    final = records(out.read_bytes())
    ids = [r["episode_id"] for r in final]
    assert len(ids) == len(set(ids)) == 1200


def test_streams_whole_lines_to_a_pipe():
    proc = subprocess.run(
        f"'{command_path('dphil-rollout')}' -m scripted:random --episodes 5000 | head -n 3",
        shell=True,
        capture_output=True,
    )
    assert proc.returncode == 0 and proc.stderr == b""
    assert [r["seed"] for r in records(proc.stdout)] == [0, 1, 2]
