"""Loading a local model: the torch stack, the device and dtype, memory, the weights and a LoRA adapter.

torch, transformers and peft are imported here, when a model is actually loaded, with a
MissingExtraError naming what to install when they are not there; a model or adapter
that cannot be loaded is one line naming it (exit 66 when it is missing, 65 when broken).

Offline means offline: every load reads local files only (`local_files_only=True`),
and the process is put in Hugging Face's offline mode before transformers is
imported, so a name that is not a local directory (a hub id a record or an option
names) is exit 66 without a single request to the hub.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from dphil.agents.chat_templates import for_family
from dphil.core.adapter_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from dphil.io.errors import DataError, MissingExtraError, NoInputError, UsageError


def hub_offline() -> None:
    """Put this process (and its children) in Hugging Face's offline mode: no hub requests.

    The environment is read when huggingface_hub is imported; when it already is, its
    constant is set too (it is read at call time, by every request it would make).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants: Any = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


def import_torch_stack() -> tuple[Any, Any]:
    """torch and transformers, or a MissingExtraError saying what to install."""
    hub_offline()
    try:
        import torch
        import transformers
    except ImportError as e:
        raise MissingExtraError(
            f"local models need torch and transformers ({e.name} is missing): pip install 'dphil[train]'"
        ) from None
    # Deprecation chatter from the stack is not the user's problem; stderr is for progress.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)\.")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return torch, transformers


def resolve_device(device: str) -> str:
    torch, _ = import_torch_stack()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is available")
    return device


def resolve_dtype(dtype: str, device: str) -> Any:
    torch, _ = import_torch_stack()
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise UsageError(f"--dtype: unknown {dtype!r} (auto, float32, bfloat16, float16)") from None


def slow_bf16(device: str) -> str | None:
    """Why bfloat16 matrix products would be slow on `device`, or None.

    A CPU without bfloat16 instructions (AVX-512 BF16, AMX) emulates them: on an AVX2 machine
    torch multiplied bf16 matrices at 0.6 GFLOP/s against 58 in float32 (docs/performance.md).
    """
    torch, _ = import_torch_stack()
    where = resolve_device(device)
    if where.startswith("cuda"):
        return None if torch.cuda.is_bf16_supported() else f"{where} has no bfloat16 arithmetic"
    check = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    try:
        native = True if check is None else bool(check())
    except (RuntimeError, AttributeError):
        native = True  # cannot tell: say nothing
    if native:
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"this CPU has no bfloat16 instructions (torch uses {capability}): bf16 matrix products are "
        "emulated, many times slower than float32"
    )


def return_freed_memory() -> None:
    """Serve blocks of 1 MiB and more straight from mmap (glibc), so freeing one returns it.

    A training step frees and reallocates gigabytes of activations per backward
    pass; glibc's default (an mmap threshold that rises as big blocks are freed)
    keeps them in its heaps, fragmented, and a real model's step grew from 3.5 to
    5.5 GB of resident memory that was mostly free. Elsewhere this is a no-op.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 1 << 20)
    mallopt(m_trim_threshold, 1 << 20)


def load_adapter(model: Any, adapter: str, *, trainable: bool) -> Any:
    """Wrap `model` with the LoRA adapter saved in directory `adapter`.

    One line naming it when it cannot be loaded: exit 66 when there is no adapter
    there, 65 when its files are broken (a truncated safetensors file, a pickle
    torch's weights-only loader refuses, a config peft cannot read).
    """
    hub_offline()
    try:
        from peft import PeftModel
    except ImportError:
        raise MissingExtraError("LoRA adapters need peft: pip install 'dphil[train]'") from None
    d = Path(adapter)
    if not (d / ADAPTER_CONFIG).is_file():
        raise NoInputError(f"{adapter}: not an adapter directory (no {ADAPTER_CONFIG})")
    weights = next((d / w for w in ADAPTER_WEIGHTS if (d / w).is_file()), None)
    if weights is None:
        raise NoInputError(f"{adapter}: no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})")
    try:
        with warnings.catch_warnings():  # torch's pickle warnings are not one line
            warnings.simplefilter("ignore")
            return PeftModel.from_pretrained(model, adapter, is_trainable=trainable, local_files_only=True)
    except MemoryError:
        raise
    except Exception as e:  # safetensors, torch's unpickler, peft's ValueError / KeyError, OSError...
        name = type(e).__name__
        if name == "UnpicklingError":
            why = "torch's weights-only loader refused it (not plain tensors: corrupt, or not a weights file)"
            raise DataError(f"{weights}: cannot load the adapter: {why}") from None
        where = weights if name == "SafetensorError" or "safetensors" in type(e).__module__ else d
        raise DataError(f"{where}: cannot load the adapter: {name}: {_first_line(e)}") from None


def load_pretrained(transformers: Any, path: str, dtype: Any) -> tuple[Any, Any]:
    """Tokenizer and causal LM from `path`; one line naming it when they cannot be loaded.

    Exit 66 when there is no model there (no directory, no config.json, missing
    files), 65 when what is there is broken (unreadable config, truncated weights).
    """
    hub_offline()
    p = Path(path)
    local = p.exists() or path.startswith((".", "/", "~"))
    if local and not (p / "config.json").is_file():
        what = "no config.json" if p.is_dir() else "no such directory"
        raise NoInputError(f"{path}: not a transformers model directory ({what})")
    try:
        with warnings.catch_warnings():  # torch's pickle warnings are not one line
            warnings.simplefilter("ignore")
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except MemoryError:
        raise
    except OSError as e:  # files missing (or not in the local hub cache), or unreadable
        if not local:  # a hub id: only the local cache is read, nothing is downloaded
            raise NoInputError(
                f"{path}: no such model directory, nor in the local Hugging Face cache (dphil downloads nothing)"
            ) from None
        missing = "does not appear to have" in str(e) or "no file named" in str(e)
        error = NoInputError if missing else DataError
        raise error(f"{path}: cannot load the model: {_first_line(e)}") from None
    except Exception as e:  # transformers raises ValueError, KeyError, safetensors errors...
        if type(e).__name__ == "UnpicklingError":
            why = "torch's weights-only loader refused its weights (not plain tensors)"
            raise DataError(f"{path}: cannot load the model: {why}") from None
        raise DataError(f"{path}: cannot load the model: {type(e).__name__}: {_first_line(e)}") from None
    return tokenizer, model


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()
    line = text[0].strip() if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """The tokens that end a reply: the chat format's end of turn first (constrained replies end so)."""
    family = for_family(getattr(model.config, "model_type", None))
    ids: list[int] = []
    for source in (
        *[tokenizer.convert_tokens_to_ids(t) for t in (family.stop if family else ())],
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
    ):
        for i in source if isinstance(source, list) else [source]:
            if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id and i not in ids:
                ids.append(i)
    if not ids:
        raise UsageError("the model's tokenizer has no end-of-turn token")
    return ids
