"""Scoring: the study's reward, its shaped variant, and checking an episode against its own turns."""

from dphil._face import lazy_face

_EXPORTS = {
    "reward": (
        "RewardSpec",
        "score",
        "gini_fairness",
        "VARIANTS",
    ),
    "score": (
        "Scorer",
        "score_record",
    ),
    "request": (
        "RewardRequest",
        "ScoreRequest",
        "run_score",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
