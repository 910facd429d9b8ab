"""Rollout: a grid of models x table sizes x seeds, sharded and resumable, written as episode records."""

from dphil._face import lazy_face

_EXPORTS = {
    "grid": ("Grid", "RunStats", "run_scripted", "parse_int_list", "parse_shard", "parse_tags"),
    "request": ("RolloutRequest", "run_request"),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
