"""A LoRA adapter directory as peft's `save_pretrained` writes it: the names every reader checks.

One home for them: checkpoint export, in-process loading and the llama.cpp converter all
look for the same files, and a change of format is made here once.
"""

from __future__ import annotations

ADAPTER_CONFIG = "adapter_config.json"
SAFETENSORS = "adapter_model.safetensors"
# What peft may have saved, in the order it loads them (older peft wrote a torch pickle).
ADAPTER_WEIGHTS = (SAFETENSORS, "adapter_model.bin")
