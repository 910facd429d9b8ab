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

Exports copy only what is inside the adapter directory: a symbolic link in it
(or anything that is not a plain file or directory) is refused, exit 65 naming
it, before anything is read or copied, so a link to a file elsewhere never
ends up published as part of an adapter. `--merge` reads local files only
(a base model that is a hub id not in the local cache is exit 66, with no
request made), and a disk that fills up during an export is exit 74.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from dphil.core.adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from dphil.io.atomic import current_umask, disk_full_error, is_disk_full
from dphil.io.errors import EX_CANTCREAT, DataError, DphilError, MissingExtraError, NoInputError


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
    _refuse_links(d, label)
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


def _refuse_links(d: Path, label: str) -> None:
    """Refuse (DataError, exit 65) an adapter directory holding anything but plain files and
    directories: a symbolic link would copy (or load) a file from outside it."""
    for root, dirs, files in os.walk(d, followlinks=False):
        for name in sorted(dirs) + sorted(files):
            path = Path(root) / name
            try:
                mode = os.lstat(path).st_mode
            except OSError as e:
                raise NoInputError(f"{path}: cannot read ({label}): {e.strerror}") from None
            if stat.S_ISLNK(mode):
                raise DataError(
                    f"{path}: a symbolic link in the adapter directory of {label}: "
                    "refused (exports copy only what is inside, and never follow links)"
                )
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise DataError(f"{path}: not a plain file in the adapter directory of {label}: refused")


def export_adapter(record: dict[str, Any], dest: str | Path) -> Path:
    """Copy the checked adapter directory to `dest` atomically; return the absolute `dest`."""
    check_adapter(record)
    src = adapter_dir(record)
    dest = Path(dest)
    with _staging(dest) as tmp:
        # Links were refused by check_adapter; one that appears since is copied as a link, never followed.
        shutil.copytree(src, tmp, symlinks=True, dirs_exist_ok=True)
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
    _hub_offline()
    try:
        import torch  # noqa: F401 - peft needs it; fail here with a clear message
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise MissingExtraError(
            f"--merge needs torch, transformers and peft ({e.name} is missing): pip install 'dphil[train]'"
        ) from None
    dest = Path(dest)
    local = Path(base).exists() or base.startswith((".", "/", "~"))
    try:
        with warnings.catch_warnings():  # torch's pickle warnings are not one line
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    except MemoryError:
        raise
    except OSError as e:
        if not local:
            raise NoInputError(
                f"{base}: no such base model directory, nor in the local Hugging Face cache (dphil downloads nothing)"
            ) from None
        raise NoInputError(f"{base}: cannot load the base model: {_first_line(e)}") from None
    except Exception as e:  # safetensors, torch's unpickler, transformers' ValueError...
        raise DataError(f"{base}: cannot load the base model: {_why(e)}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = PeftModel.from_pretrained(model, str(src), local_files_only=True)
            merged = model.merge_and_unload()
    except MemoryError:
        raise
    except Exception as e:  # a corrupt adapter: safetensors, torch's unpickler, peft
        raise DataError(f"{src}: cannot load the adapter: {_why(e)}") from None
    tokenizer_from = src if (src / "tokenizer_config.json").is_file() else base
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from, local_files_only=True)
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
            if isinstance(exc, Exception) and not isinstance(exc, DphilError) and is_disk_full(exc):
                raise disk_full_error(self.dest, exc, "cannot export") from None
            return
        try:
            os.replace(self.tmp, self.dest)
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise DphilError(f"cannot move the export into {self.dest}: {e}", exit_code=EX_CANTCREAT) from None


def _hub_offline() -> None:
    """Hugging Face's offline mode for this process: transformers and peft make no hub request
    (set before they are imported; the constant too, when huggingface_hub already is)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants: Any = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


def _first_line(e: BaseException, limit: int = 300) -> str:
    lines = str(e).strip().splitlines()
    line = lines[0].strip() if lines else type(e).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _why(e: BaseException) -> str:
    if type(e).__name__ == "UnpicklingError":  # its own text advises turning the safety off
        return "torch's weights-only loader refused it (not plain tensors: corrupt, or not a weights file)"
    return f"{type(e).__name__}: {_first_line(e)}"


def _label(record: dict[str, Any]) -> str:
    run, step = record.get("run"), record.get("step")
    return f"checkpoint step {step}" if run is None else f"checkpoint run {run!r} step {step}"
