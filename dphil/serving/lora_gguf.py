"""A trained PEFT adapter as a llama.cpp LoRA file, so the fast server can play the trained policy.

An evaluation or a rollout needs no gradient, so it can be played by an inference server
that keeps every conversation's prompt in its own slot and decodes the slots together, with
no torch in the process; llama.cpp applies the adapter at run time (`y = W x + alpha/r * B A x`,
as peft does) over the quantised base it already holds. The file is what llama.cpp's own converter
writes: `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and for every
adapted weight `NAME.lora_a` ([r, in]) and `NAME.lora_b` ([out, r]) under the base GGUF's
tensor names, which `gguf`'s name map gives for the base file's architecture.

Only what llama.cpp computes the same way is accepted: plain LoRA on linear weights (no
DoRA, no per-module ranks or alphas, no modules saved whole, no trained biases); rsLoRA's
scale is written as the equivalent alpha. Anything else is exit 65 naming the adapter.
The file is written beside its destination and renamed into place. Needs numpy,
safetensors and gguf, never torch.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

from dphil.core.adapter_files import ADAPTER_CONFIG, SAFETENSORS
from dphil.io.atomic import discard, disk_full_error, is_disk_full, publish, temp_beside
from dphil.io.errors import DataError, MissingExtraError, NoInputError, OutputError

_PREFIX = "base_model.model."
_PARTS = {".lora_A.weight": "lora_a", ".lora_B.weight": "lora_b"}


def read_adapter(adapter: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(adapter_config, {tensor name: float32 array}) of a peft `save_pretrained` directory."""
    d = Path(adapter)
    cfg_path, weights_path = d / ADAPTER_CONFIG, d / SAFETENSORS
    for p in (cfg_path, weights_path):
        if not p.is_file():
            raise NoInputError(f"{d}: not a peft adapter directory (no {p.name})")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{cfg_path}: cannot read it: {e}") from None
    if not isinstance(config, dict):
        raise DataError(f"{cfg_path}: not a JSON object")
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise MissingExtraError("reading an adapter needs safetensors: pip install 'dphil[train]'") from None
    try:
        tensors = {k: v.astype("float32") for k, v in load_file(str(weights_path)).items()}
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise DataError(f"{weights_path}: cannot read the adapter weights: {type(e).__name__}: {e}") from None
    return config, tensors


def effective_alpha(config: dict[str, Any], rank: int, where: str) -> float:
    """The alpha llama.cpp must use (it scales by alpha / r) for peft's scale; refuses what it cannot express."""
    if config.get("peft_type", "LORA") != "LORA":
        raise DataError(f"{where}: a {config.get('peft_type')} adapter, not LoRA")
    for key, why in (
        ("use_dora", "DoRA"),
        ("rank_pattern", "per-module ranks"),
        ("alpha_pattern", "per-module alphas"),
        ("modules_to_save", "modules saved whole"),
    ):
        if config.get(key):
            raise DataError(f"{where}: uses {why}, which llama.cpp's LoRA files cannot hold")
    if config.get("bias", "none") != "none":
        raise DataError(
            f"{where}: trains biases (bias = {config.get('bias')!r}), which llama.cpp's LoRA files cannot hold"
        )
    alpha = float(config.get("lora_alpha", config.get("r", rank)))
    # rsLoRA scales by alpha / sqrt(r); llama.cpp by alpha / r.
    return alpha * math.sqrt(rank) if config.get("use_rslora") else alpha


def lora_tensors(tensors: dict[str, Any], architecture: str, where: str) -> dict[str, Any]:
    """{GGUF name: array}: each peft A and B under its base weight's GGUF name, `.lora_a`/`.lora_b`."""
    import gguf

    arches = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    if architecture not in arches:
        raise DataError(f"{where}: gguf knows no architecture {architecture!r}")
    blocks = 1 + max((_block(k) for k in tensors), default=0)
    names = gguf.get_tensor_name_map(arches[architecture], blocks)
    out: dict[str, Any] = {}
    for key, value in sorted(tensors.items()):
        part = next((p for p in _PARTS if key.endswith(p)), None)
        if part is None:
            raise DataError(f"{where}: tensor {key!r} is not a LoRA A or B weight")
        base = key.removeprefix(_PREFIX).removesuffix(part) + ".weight"
        mapped = names.get_name(base, try_suffixes=(".weight",))
        if mapped is None:
            raise DataError(f"{where}: {architecture} has no weight for {base!r}")
        out[f"{mapped}.{_PARTS[part]}"] = value
    for name in out:
        twin = name[:-1] + ("b" if name.endswith("a") else "a")
        if twin not in out:
            raise DataError(f"{where}: {name.rsplit('.', 1)[0]} has no {twin.rsplit('.', 1)[1]}")
    return out


def write_lora_gguf(adapter: str | os.PathLike, dest: str | os.PathLike, *, architecture: str) -> Path:
    """Write `adapter` (a peft directory) to `dest` as a llama.cpp LoRA GGUF for an `architecture` base."""
    try:
        import gguf
    except ImportError:
        raise MissingExtraError("writing a llama.cpp adapter needs gguf: pip install 'dphil[local]'") from None
    where = str(adapter)
    config, tensors = read_adapter(adapter)
    out = lora_tensors(tensors, architecture, where)
    ranks = {v.shape[0] for k, v in out.items() if k.endswith(".lora_a")}
    if len(ranks) != 1:
        raise DataError(f"{where}: LoRA ranks differ between modules ({sorted(ranks)})")
    alpha = effective_alpha(config, ranks.pop(), where)
    dest = Path(dest)
    fd, tmp = temp_beside(dest)
    os.close(fd)  # GGUFWriter opens the file by name
    try:
        writer = gguf.GGUFWriter(str(tmp), architecture)
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, value in out.items():
            writer.add_tensor(name, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        publish(tmp, dest)
    except OSError as e:
        discard(tmp)
        raise disk_full_error(dest, e) if is_disk_full(e) else OutputError(f"{dest}: cannot write: {e}") from None
    except BaseException:
        discard(tmp)
        raise
    return dest


def _block(key: str) -> int:
    parts = key.split(".")
    for a, b in itertools.pairwise(parts):
        if a in ("layers", "h", "blocks") and b.isdigit():
            return int(b)
    return 0
