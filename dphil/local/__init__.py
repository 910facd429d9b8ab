"""In-process models (transformers + peft): the batched player, decoding, packing, `hf:` and checkpoint entries.

Used by both `dphil-rollout` (evaluation) and `dphil-train` (the peft backend); torch is imported
only when a model is actually loaded.
"""

from dphil._face import lazy_face

_EXPORTS = {
    "entries": (
        "is_local",
        "LocalSettings",
        "LocalEntry",
        "checkpoint_entries",
        "run_local",
        "HF_PREFIX",
    ),
    "model": (
        "LocalModel",
        "LORA_TARGETS",
    ),
    "loading": (
        "load_pretrained",
        "load_adapter",
    ),
    "packing": (
        "pack",
        "PackedBatch",
    ),
    "play": (
        "play_episodes",
        "Played",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
