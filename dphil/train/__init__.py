"""Training an agent at the table with GRPO (`dphil-train`): the loop, credit assignment,
the curriculum, and the peft and ART backends.

Nothing here imports torch, transformers, peft or ART at import time: each backend imports
its stack when a run needs it, so `dphil-train --help` is fast.
"""

from dphil._face import lazy_face

_EXPORTS = {
    "advantages": (
        "AdvantageSpec",
        "MODES",
        "turn_advantages",
        "philosopher_returns",
    ),
    "grpo": (
        "group_advantages",
        "grpo_loss",
    ),
    "curriculum": (
        "Curriculum",
        "parse_curriculum",
    ),
    "loop": (
        "TrainConfig",
        "run_training",
    ),
    "launch": (
        "TrainRequest",
        "launch",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
