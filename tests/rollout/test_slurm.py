"""samples/slurm/grid.sbatch on a real single-node Slurm cluster (`bash .ci/setup` starts one).

The array's shard files together must be exactly the unsharded grid: the same lines, each
once, whole; a task cancelled mid-run and resubmitted must finish its shard without repeats.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.support.commands import ROOT, need_system_part, run

pytestmark = pytest.mark.slurm

SBATCH = ROOT / "samples" / "slurm" / "grid.sbatch"
VENV = Path(sys.executable).parent.parent
JOB_SECONDS = 120  # a bound on waiting, not a timing assumption: these jobs take seconds


def cluster_up() -> bool:
    if shutil.which("sbatch") is None:
        return False
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and any(s in {"idle", "mixed", "allocated", "completing"} for s in proc.stdout.split())


@pytest.fixture(scope="module")
def slurm():
    need_system_part(cluster_up(), "a Slurm cluster (samples/slurm/start-cluster.sh)")


@pytest.fixture
def jobs():
    """Submit grid.sbatch; whatever a failing test leaves queued is cancelled."""
    submitted: list[str] = []

    def submit(cwd: Path, array: str, grid: list[str]) -> str:
        env = {**os.environ, "DPHIL_VENV": str(VENV)}
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--array={array}", str(SBATCH), *grid],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip().split(";")[0]
        submitted.append(job)
        return job

    yield submit
    for job in submitted:
        subprocess.run(["scancel", job], capture_output=True, timeout=60)


def task_states(job: str) -> dict[str, str]:
    """ArrayTaskId -> JobState for every task of an array job (pending ranges as one entry)."""
    proc = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    states = {}
    for line in proc.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        states[fields.get("ArrayTaskId", "")] = fields["JobState"]
    return states


def wait_for(job: str, cwd: Path) -> dict[str, str]:
    """Wait until no task of `job` is pending or running; its tasks' final states."""
    deadline = time.monotonic() + JOB_SECONDS
    while time.monotonic() < deadline:
        queued = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True, timeout=60)
        if queued.returncode == 0 and not queued.stdout.strip():
            return task_states(job)
        time.sleep(0.2)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(cwd.glob("*.log")))
    pytest.fail(f"job {job} still queued after {JOB_SECONDS} s: {task_states(job)}\n{logs}")


def lines_of(path: Path) -> list[bytes]:
    """A file's lines, checking that every one is whole and is a JSON object."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path.name}: torn last line"
    lines = data.splitlines()
    for lineno, line in enumerate(lines, 1):
        assert isinstance(orjson.loads(line), dict), f"{path.name}:{lineno}"
    return lines


def unsharded(grid: list[str]) -> list[bytes]:
    proc = run(["dphil-rollout", "-q", *grid])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def shard_files(cwd: Path) -> list[Path]:
    return sorted(cwd.glob("grid.*.jsonl"))


def episode_ids(lines: list[bytes]) -> Counter:
    return Counter(orjson.loads(line)["episode_id"] for line in lines)


def test_array_of_four_shards_is_the_unsharded_grid(slurm, jobs, tmp_path):
    grid = ["-m", "scripted:random", "-m", "scripted:hierarchy", "-n", "5,10", "--episodes", "60"]
    job = jobs(tmp_path, "0-3", grid)
    states = wait_for(job, tmp_path)
    assert states == dict.fromkeys(["0", "1", "2", "3"], "COMPLETED"), states

    files = shard_files(tmp_path)
    assert [p.name for p in files] == [f"grid.{i}.jsonl" for i in range(4)]
    shards = [lines_of(p) for p in files]
    assert [len(s) for s in shards] == [60] * 4  # 240 episodes, every 4th to each task
    union = [line for s in shards for line in s]
    expected = unsharded(grid)
    assert len(set(expected)) == 240
    # The same episodes byte for byte (scripted episodes are deterministic), each exactly once.
    assert Counter(union) == Counter(expected)
    assert set(episode_ids(union).values()) == {1}


def test_cancelled_task_resubmitted_finishes_without_duplicates(slurm, jobs, tmp_path):
    # 20,000 short episodes per shard: the cancelled task is caught after its first lines and long
    # before its last (each file is flushed every 64 KiB, about 120 episodes).
    grid = ["-m", "scripted:random", "-n", "2", "--rounds", "1", "--episodes", "80000"]
    per_shard = 20000
    job = jobs(tmp_path, "0-3", grid)
    victim = tmp_path / "grid.1.jsonl"
    deadline = time.monotonic() + JOB_SECONDS
    while not (victim.exists() and b"\n" in victim.read_bytes()[: 1 << 20]):
        assert time.monotonic() < deadline, f"task 1 wrote nothing: {task_states(job)}"
        time.sleep(0.01)
    cancel = subprocess.run(["scancel", f"{job}_1"], capture_output=True, text=True, timeout=60)
    assert cancel.returncode == 0, cancel.stderr

    states = wait_for(job, tmp_path)
    assert states == {"0": "COMPLETED", "1": "CANCELLED", "2": "COMPLETED", "3": "COMPLETED"}, states
    partial = lines_of(victim)  # SIGTERM: dphil-rollout stopped after a whole line
    assert 0 < len(partial) < per_shard

    again = jobs(tmp_path, "1", grid)  # the same script and grid, just task 1 (K stays 4)
    assert wait_for(again, tmp_path) == {"1": "COMPLETED"}
    resumed = lines_of(victim)
    assert resumed[: len(partial)] == partial  # kept, not rewritten
    assert len(resumed) == per_shard

    union = [line for p in shard_files(tmp_path) for line in lines_of(p)]
    ids = episode_ids(union)
    assert max(ids.values()) == 1
    assert ids == episode_ids(unsharded(grid))


def test_starting_the_cluster_again_leaves_it_running(slurm):
    state = Path(os.environ.get("DPHIL_SLURM_STATE", "/var/spool/dphil-slurm"))
    files = {name: state / f"{name}.pid" for name in ("slurmctld", "slurmd")}
    need_system_part(all(f.exists() for f in files.values()), "a cluster started by samples/slurm/start-cluster.sh")
    pids = {name: f.read_text() for name, f in files.items()}
    proc = subprocess.run(
        ["bash", str(ROOT / "samples" / "slurm" / "start-cluster.sh")], capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    assert {name: f.read_text() for name, f in files.items()} == pids  # the same daemons
    assert cluster_up()
