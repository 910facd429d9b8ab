"""dphil-weights: the packaged real model, assembled and verified; bad copies refused whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dphil.io.errors import DataError, NoInputError
from dphil.serving import weights
from tests.support.commands import run


def test_missing_gguf_is_one_line_exit_66(tmp_path):
    missing = tmp_path / "nope.gguf"
    proc = run(["dphil-weights", "--gguf", str(missing)])
    assert proc.returncode == 66
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and str(missing) in err and "Traceback" not in err


def test_truncated_gguf_is_exit_65(tmp_path):
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF" + b"\0" * 1000)
    proc = run(["dphil-weights", "--gguf", str(short), "--gguf-only"])
    assert proc.returncode == 65
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and str(short) in err and "truncated" in err


def test_wrong_checksum_is_exit_65(tmp_path):
    bad = tmp_path / "bad.gguf"
    with open(bad, "wb") as fh:  # the right size, the wrong bytes (sparse: no disk used)
        fh.truncate(weights.GGUF_SIZE)
    proc = run(["dphil-weights", "--gguf", str(bad)])
    assert proc.returncode == 65
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "sha256 mismatch" in err and str(bad) in err
    assert not (tmp_path / weights.HF_NAME).exists()


def test_corrupt_chunks_leave_nothing_in_the_cache(tmp_path):
    parts = []
    for i in range(4):
        p = tmp_path / f"part{i:02d}"
        p.write_bytes(os.urandom(1000))
        parts.append(p)
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match="truncated or corrupt"):
        weights.assemble(cache / weights.GGUF_NAME, parts=parts)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_missing_chunk_is_no_input(tmp_path):
    with pytest.raises(NoInputError, match="part03"):
        weights.assemble(tmp_path / weights.GGUF_NAME, parts=[tmp_path / "part03"])


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DPHIL_CACHE", str(tmp_path / "c"))
    assert weights.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("DPHIL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert weights.cache_dir() == tmp_path / "x" / "dphil"


@pytest.fixture
def small_model(tmp_path, monkeypatch):
    """A 3 kB stand-in for the packaged GGUF (its chunks, size and sha256), a fake conversion,
    and a count of the files `sha256_of` hashes: the command's own logic, in a few ms."""
    import hashlib

    parts = []
    for i in range(3):
        part = tmp_path / "chunks" / f"part{i:02d}"
        part.parent.mkdir(exist_ok=True)
        part.write_bytes(os.urandom(1000))
        parts.append(part)
    whole = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(weights, "GGUF_SIZE", len(whole))
    monkeypatch.setattr(weights, "GGUF_SHA256", hashlib.sha256(whole).hexdigest())
    monkeypatch.setattr(weights, "chunk_paths", lambda: parts)

    def fake_convert(gguf, out, progress=False):
        (out / weights.MARKER).write_text(json.dumps({"gguf_sha256": weights.GGUF_SHA256}))

    monkeypatch.setattr(weights, "_convert_into", fake_convert)
    hashed = []
    real_sha256_of = weights.sha256_of

    def counting(path):
        hashed.append(path)
        return real_sha256_of(path)

    monkeypatch.setattr(weights, "sha256_of", counting)
    return {"whole": whole, "hashed": hashed, "cache": tmp_path / "cache"}


def test_one_run_hashes_the_gguf_once_and_still_rebuilds_a_corrupt_copy(small_model):
    from click.testing import CliRunner
    from dphil.commands.weights import main

    cache, hashed = small_model["cache"], small_model["hashed"]
    gguf = cache / weights.GGUF_NAME

    def dphil_weights(*args):
        hashed.clear()
        result = CliRunner().invoke(main, ["--cache", str(cache), *args])
        assert result.exit_code == 0, result.output
        return result

    first = dphil_weights()  # assembled (hashed on the way in) and converted: no file hashed
    assert hashed == [] and "assembling" in first.output and "converting" in first.output
    assert gguf.read_bytes() == small_model["whole"] and weights.converted(cache / weights.HF_NAME)
    again = dphil_weights()  # only verifies
    assert hashed == [gguf] and "assembling" not in again.output and "converting" not in again.output
    dphil_weights("--gguf-only")
    assert hashed == [gguf]
    dphil_weights("--gguf", str(gguf))
    assert hashed == [gguf]
    # A cached copy of the right size with one byte altered is still caught, and rebuilt.
    data = bytearray(small_model["whole"])
    data[1500] ^= 0xFF
    gguf.write_bytes(bytes(data))
    rebuilt = dphil_weights("--gguf-only")
    assert hashed == [gguf] and "assembling" in rebuilt.output
    assert gguf.read_bytes() == small_model["whole"]
    # ... and a corrupt copy given with --gguf is refused, converted cache or not.
    bad = cache.parent / "bad.gguf"
    bad.write_bytes(bytes(data))
    refused = CliRunner().invoke(main, ["--cache", str(cache), "--gguf", str(bad)])
    assert refused.exit_code == 65 and "sha256 mismatch" in refused.output


@pytest.mark.real_model
def test_real_model_is_verified_and_converted(real_model):
    gguf, hf = real_model
    assert weights.verify(gguf) == gguf
    assert weights.converted(hf)
    info = json.loads((hf / weights.MARKER).read_text())
    assert info["gguf_sha256"] == weights.GGUF_SHA256 and info["model_type"] == "gemma3_text"
    config = json.loads((hf / "config.json").read_text())
    assert "quantization_config" not in config
    assert "<start_of_turn>" in (hf / "tokenizer_config.json").read_text() + "".join(
        p.read_text() for p in hf.glob("chat_template.*")
    )
    # A second run only verifies: it prints the same directory.
    again = run(["dphil-weights", "-q"])
    assert again.returncode == 0 and again.stdout.decode().strip() == str(hf)


@pytest.mark.real_model
def test_a_corrupt_cached_gguf_is_rebuilt_from_the_chunks(real_model, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / weights.GGUF_NAME
    target.write_bytes(b"half a file")
    proc = run(["dphil-weights", "--gguf-only", "--cache", str(cache)])
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == str(target)
    assert weights.sha256_of(target) == weights.GGUF_SHA256
    assert sorted(p.name for p in cache.iterdir()) == sorted([weights.GGUF_NAME, f".{weights.GGUF_NAME}.lock"])


@pytest.mark.real_model
def test_quiet_conversion_into_a_fresh_cache_writes_nothing_on_stderr(real_model, tmp_path):
    """-q from cron or a pipe: no conversion bar (transformers draws one with tqdm directly)."""
    cache = tmp_path / "cache"
    proc = run(["dphil-weights", "-q", "--cache", str(cache)], timeout=1200)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    hf = Path(proc.stdout.decode().strip())
    assert hf.parent == cache and weights.converted(hf)
