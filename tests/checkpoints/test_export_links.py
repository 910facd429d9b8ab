"""`dphil-ckpt-select --export` copies only what is inside the adapter directory.

A symbolic link in an adapter directory (to a file elsewhere, as the adapter's weights, or to a
directory), or anything else that is not a plain file or directory, is refused with exit 65 and
one line naming it, before anything is read or copied: no link is ever followed, so no file from
outside ends up published as part of an adapter. `--merge` checks the same before loading.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.commands import command_path


def adapter(d: Path) -> Path:
    """An adapter directory as peft writes one (export copies it; nothing loads the weights)."""
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/models/base", "r": 8}))
    (d / "adapter_model.safetensors").write_bytes(b"weights" * 16)
    (d / "README.md").write_text("an adapter\n")
    return d


def select(tmp_path: Path, src: Path, *extra: str) -> subprocess.CompletedProcess:
    ck = tmp_path / "ck.jsonl"
    rec = {"kind": "checkpoint", "run": "r", "step": 1, "path": str(src), "train_reward": 0.5, "lora_rank": 8}
    ck.write_text(json.dumps(rec) + "\n")
    argv = [command_path("dphil-ckpt-select"), str(ck), "--by", "train", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture
def secret(tmp_path) -> Path:
    p = tmp_path / "outside" / "secret.txt"
    p.parent.mkdir()
    p.write_text("TOP SECRET: not part of any adapter\n")
    return p


def refused(proc, link: Path, dest: Path) -> None:
    assert proc.returncode == 65, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert str(link) in line and "symbolic link" in line
    assert proc.stdout == ""
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}.")]  # no staging left


def test_a_link_to_a_file_outside_is_refused_not_copied(tmp_path, secret):
    src = adapter(tmp_path / "run" / "0001")
    link = src / "notes.txt"
    link.symlink_to(secret)
    dest = tmp_path / "exported"
    refused(select(tmp_path, src, "--export", str(dest)), link, dest)
    copies = [f for f in tmp_path.rglob("*") if f.is_file() and not f.is_symlink() and f != secret]
    assert not any(f.read_bytes() == secret.read_bytes() for f in copies)


def test_linked_weights_and_a_linked_directory_are_refused(tmp_path, secret):
    src = adapter(tmp_path / "a" / "0001")
    weights = src / "adapter_model.safetensors"
    weights.unlink()
    weights.symlink_to(secret)
    dest = tmp_path / "a-out"
    refused(select(tmp_path, src, "--export", str(dest)), weights, dest)

    src = adapter(tmp_path / "b" / "0001")
    (src / "sub").mkdir()
    link = src / "sub" / "elsewhere"
    link.symlink_to(secret.parent, target_is_directory=True)
    dest = tmp_path / "b-out"
    refused(select(tmp_path, src, "--export", str(dest)), link, dest)


def test_a_linked_config_is_refused_before_it_is_read(tmp_path):
    src = adapter(tmp_path / "run" / "0001")
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({"base_model_name_or_path": "/models/base", "r": 8}))
    config = src / "adapter_config.json"
    config.unlink()
    config.symlink_to(outside)
    dest = tmp_path / "exported"
    refused(select(tmp_path, src, "--export", str(dest)), config, dest)


def test_merge_refuses_links_before_loading_anything(tmp_path, secret):
    src = adapter(tmp_path / "run" / "0001")
    link = src / "notes.txt"
    link.symlink_to(secret)
    dest = tmp_path / "merged"
    refused(select(tmp_path, src, "--export", str(dest), "--merge"), link, dest)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need os.mkfifo")
def test_a_named_pipe_is_refused_not_read(tmp_path):
    src = adapter(tmp_path / "run" / "0001")
    os.mkfifo(src / "pipe")
    dest = tmp_path / "exported"
    proc = select(tmp_path, src, "--export", str(dest))
    assert proc.returncode == 65, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert str(src / "pipe") in line and "not a plain file" in line
    assert not dest.exists()


def test_an_adapter_without_links_is_exported_byte_for_byte(tmp_path):
    src = adapter(tmp_path / "run" / "0001")
    (src / "sub").mkdir()
    (src / "sub" / "extra.bin").write_bytes(b"\x00\x01")
    dest = tmp_path / "exported"
    proc = select(tmp_path, src, "--export", str(dest))
    assert proc.returncode == 0, proc.stderr
    for f in src.rglob("*"):
        twin = dest / f.relative_to(src)
        assert twin.is_dir() if f.is_dir() else twin.read_bytes() == f.read_bytes()
        assert not twin.is_symlink()
