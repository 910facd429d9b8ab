"""Handing a chosen adapter on: check it is what its record says, copy it, or merge it.

A checkpoint record is only a claim about a directory. Before anything is
exported the directory must exist, hold a PEFT adapter, and its
`adapter_config.json` must name the record's base model and LoRA rank; a
mismatch means the record and the weights have drifted apart, and exporting
would publish the wrong adapter under the right name.

Exports are atomic: everything is written into a temporary sibling of the
destination, which is renamed into place only when complete, so a failed or
interrupted export never leaves a half-written model where a deployment
script would pick it up. torch, transformers and peft are imported only by
`merge_adapter`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from dphil.io.atomic import current_umask
from dphil.io.errors import EX_CANTCREAT, DataError, DphilError, MissingExtraError, NoInputError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_dir(record: dict[str, Any]) -> Path:
    """The record's adapter directory, which must exist (NoInputError, exit 66, if gone)."""
    path = record.get("path")
    label = _label(record)
    if not path:
        raise NoInputError(f"{label} names no adapter directory ('path')")
    p = Path(path)
    if not p.is_dir():
        what = "is not a directory" if p.exists() else "does not exist"
        raise NoInputError(f"adapter directory of {label} {what}: {path}")
    return p


def check_adapter(record: dict[str, Any]) -> dict[str, Any]:
    """Check the adapter directory against its record and return its adapter_config.

    The config must name the record's `base_model` (when the record has one)
    and have `r` equal to the record's `lora_rank` (when it has one), and the
    directory must hold adapter weights.
    """
    d = adapter_dir(record)
    label = _label(record)
    cfg_path = d / ADAPTER_CONFIG
    if not cfg_path.is_file():
        raise NoInputError(f"{d} holds no {ADAPTER_CONFIG}: not a PEFT adapter ({label})")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"cannot read {cfg_path}: {e}") from None
    if not isinstance(config, dict):
        raise DataError(f"{cfg_path} is not a JSON object")
    if not any((d / w).is_file() for w in ADAPTER_WEIGHTS):
        raise NoInputError(f"{d} holds no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    base = record.get("base_model")
    cfg_base = config.get("base_model_name_or_path")
    if base is not None and cfg_base != base:
        raise DataError(f"{cfg_path} says base model {cfg_base!r} but {label} says {base!r}")
    rank = record.get("lora_rank")
    if rank is not None and config.get("r") != rank:
        raise DataError(f"{cfg_path} says LoRA rank {config.get('r')!r} but {label} says {rank}")
    return config


def export_adapter(record: dict[str, Any], dest: str | Path) -> Path:
    """Copy the checked adapter directory to `dest` atomically; return the absolute `dest`."""
    check_adapter(record)
    src = adapter_dir(record)
    dest = Path(dest)
    with _staging(dest) as tmp:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
    return dest.resolve()


def merge_adapter(record: dict[str, Any], dest: str | Path, *, base_model: str | None = None) -> Path:
    """Merge the checked adapter into its base weights (peft `merge_and_unload`) at `dest`.

    `base_model` overrides where the base weights are loaded from (a local copy
    of the record's base model); the adapter is still checked against the
    record's own `base_model`. The tokenizer is saved alongside, so `dest` is a
    complete model directory for deployment.
    """
    config = check_adapter(record)
    src = adapter_dir(record)
    base = base_model or record.get("base_model") or config.get("base_model_name_or_path")
    if not base:
        raise DataError(
            f"{_label(record)}: no base model to merge into (record, adapter config and --base-model are all silent)"
        )
    try:
        import torch  # noqa: F401 - peft needs it; fail here with a clear message
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise MissingExtraError(
            f"--merge needs torch, transformers and peft ({e.name} is missing): pip install 'dphil[train]'"
        ) from None
    dest = Path(dest)
    try:
        model = AutoModelForCausalLM.from_pretrained(base)
        model = PeftModel.from_pretrained(model, str(src))
        merged = model.merge_and_unload()
    except OSError as e:
        raise NoInputError(f"cannot load base model {base!r} with adapter {src}: {e}") from None
    tokenizer_from = src if (src / "tokenizer_config.json").is_file() else base
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    except (OSError, ValueError):
        tokenizer = None
    with _staging(dest) as tmp:
        merged.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if not (tmp / "config.json").is_file():
            raise DphilError(f"merging {src} wrote no config.json")
    return dest.resolve()


class _staging:
    """Write into a temporary sibling of `dest`; rename it to `dest` only on success.

    `dest` may be absent or an empty directory; anything else is refused
    rather than overwritten (exit 73).
    """

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        d = self.dest
        if d.exists() and not (d.is_dir() and not any(d.iterdir())):
            raise DphilError(f"export destination exists and is not empty: {d}", exit_code=EX_CANTCREAT)
        parent = d.resolve().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", suffix=".tmp", dir=parent))
            # mkdtemp makes it private (0700); give the export the usual permissions.
            self.tmp.chmod(0o777 & ~current_umask())
        except OSError as e:
            raise DphilError(f"cannot create {d}: {e}", exit_code=EX_CANTCREAT) from None
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.tmp is not None
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        try:
            os.replace(self.tmp, self.dest)
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise DphilError(f"cannot move the export into {self.dest}: {e}", exit_code=EX_CANTCREAT) from None


def _label(record: dict[str, Any]) -> str:
    run, step = record.get("run"), record.get("step")
    return f"checkpoint step {step}" if run is None else f"checkpoint run {run!r} step {step}"
