"""A disk that fills up is exit 74 with one line naming the file, whichever library was writing.

For real: a tiny tmpfs (`mount -t tmpfs -o size=64k`, which needs root; skipped with the reason
otherwise) filled by the JSONL writer, an atomic write (`dphil-show`), a checkpoint saved by
`dphil-train` (safetensors' "No space left on device", then torch's optimiser state) and an
adapter export; and /dev/full, which fails every write with ENOSPC and needs no privileges.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dphil.io.atomic import atomic_file, is_disk_full
from dphil.io.errors import OutputError
from tests.support.commands import PROMPT, command_path, run

HAS_DEV_FULL = Path("/dev/full").exists()


def mount_tmpfs(d: Path, size: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small file system to fill")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs to fill (needs root): {proc.stderr.decode().strip()}")


@pytest.fixture
def small_disk(tmp_path):
    """Mount a tmpfs of the given size at a fresh directory; every one is unmounted afterwards."""
    mounted: list[Path] = []

    def make(size: str = "64k") -> Path:
        d = tmp_path / f"disk{len(mounted)}"
        mount_tmpfs(d, size)
        mounted.append(d)
        return d

    yield make
    for d in mounted:
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(disk: Path, leave: int = 4096) -> None:
    """Fill `disk` until about `leave` bytes are free."""
    free = shutil.disk_usage(disk).free
    if free > leave:
        (disk / "filler").write_bytes(b"\0" * (free - leave))


def full_line(proc, target: str | Path) -> str:
    err = proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr
    assert proc.returncode == 74, err
    (line,) = err.splitlines()
    assert str(target) in line and "internal error" not in line, line
    assert "No space left on device" in line, line
    return line


@pytest.fixture(scope="module")
def episodes() -> bytes:
    """Scored episodes, about 40 KB: more than a nearly full disk takes."""
    played = run(["dphil-rollout", "-m", "scripted:naive", "-n", "5", "--episodes", "8", "--rounds", "20"])
    assert played.returncode == 0, played.stderr
    scored = run(["dphil-score"], input=played.stdout)
    assert scored.returncode == 0, scored.stderr
    return scored.stdout


# -- the library's own writers ------------------------------------------------------------


def test_disk_full_is_recognised_in_every_library_s_words():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("bad value"))


@pytest.mark.skipif(not HAS_DEV_FULL, reason="no /dev/full on this system")
def test_atomic_file_on_dev_full_is_an_output_error():
    with (
        pytest.raises(OutputError, match="/dev/full: cannot write: No space left on device"),
        atomic_file("/dev/full") as fh,
    ):
        fh.write(b"x" * 100_000)
        fh.flush()


@pytest.mark.skipif(not HAS_DEV_FULL, reason="no /dev/full on this system")
def test_commands_writing_to_dev_full_exit_74(episodes):
    full_line(run(["dphil-show", "-", "-e", "0", "--format", "svg", "-o", "/dev/full"], input=episodes), "/dev/full")
    full_line(run(["dphil-score", "-o", "/dev/full"], input=episodes), "/dev/full")


def test_jsonl_output_on_a_full_disk(small_disk, episodes):
    disk = small_disk()
    fill(disk)
    target = disk / "scored.jsonl"
    full_line(run(["dphil-score", "-o", str(target)], input=episodes), target)
    # Nothing published: the final flush failed, so no empty or partial file was renamed into place.
    assert not target.exists() and not list(disk.glob(".scored.jsonl.*"))
    target.write_bytes(b'{"old": 1}\n')  # an old file is kept as it was
    (disk / "filler").unlink()
    fill(disk)
    full_line(run(["dphil-score", "-o", str(target)], input=episodes), target)
    assert target.read_bytes() == b'{"old": 1}\n'
    # stdout redirected onto the full disk
    with open(disk / "out.jsonl", "wb") as out:
        proc = subprocess.run([command_path("dphil-score")], input=episodes, stdout=out, stderr=subprocess.PIPE)
    full_line(proc, "<stdout>")


def test_an_atomic_write_on_a_full_disk(small_disk, episodes):
    # dphil-show writes through atomic_file; this exited 70 with a bare OSError.
    disk = small_disk()
    fill(disk)
    for name in ("timelines.html", "one.svg"):
        target = disk / name
        args = ["-e", "0"] if name.endswith(".svg") else []
        full_line(run(["dphil-show", "-", *args, "-o", str(target)], input=episodes), target)
        assert not target.exists()
    proc = run(["dphil-show", "-", "-o", f"{disk / 'many'}/"], input=episodes)
    assert proc.returncode == 74 and "No space left on device" in proc.stderr.decode()


# -- checkpoints and exports ------------------------------------------------------------------


@pytest.mark.parametrize("size", ["64k", "160k"], ids=["adapter-weights", "optimiser-state"])
def test_a_checkpoint_saved_onto_a_full_disk(small_disk, tiny, tmp_path, size):
    # 64k: safetensors fails writing the adapter ("SafetensorError ... No space left", was exit 70);
    # 160k: the adapter fits and torch's optimiser state does not ("unexpected pos", was exit 70).
    pytest.importorskip("peft")
    disk = small_disk(size)
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPT)
    run_dir = disk / "run"
    args = ["--steps", "1", "--groups", "1", "--group-size", "2", "--prompt-file", str(prompt)]
    args += ["-n", "3", "--rounds", "2", "--memory", "none", "--threads", "1"]
    proc = run(["dphil-train", "--base-model", str(tiny), "--run-dir", str(run_dir), *args], timeout=600)
    line = full_line(proc, run_dir)
    assert "cannot save the checkpoint" in line or "cannot write" in line


def test_an_export_onto_a_full_disk(small_disk, tmp_path):
    src = tmp_path / "run" / "0001"
    src.mkdir(parents=True)
    (src / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base", "r": 8}))
    (src / "adapter_model.safetensors").write_bytes(os.urandom(256 * 1024))  # more than the disk holds
    ck = tmp_path / "ck.jsonl"
    ck.write_text(json.dumps({"kind": "checkpoint", "step": 1, "path": str(src), "train_reward": 0.5}) + "\n")
    disk = small_disk()
    dest = disk / "best"
    proc = run(["dphil-ckpt-select", str(ck), "--by", "train", "--export", str(dest)])
    full_line(proc, dest)
    assert list(disk.iterdir()) == []  # the staging directory is gone
