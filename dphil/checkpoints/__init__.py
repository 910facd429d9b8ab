"""Checkpoints: the record, the rules that choose one, exporting its adapter, and the curve picture."""

from dphil._face import lazy_face

_EXPORTS = {
    "record": (
        "Checkpoint",
        "load_checkpoints",
        "read_inputs",
    ),
    "selection": (
        "Selection",
        "select",
        "BY",
        "RULES",
    ),
    "export": (
        "check_adapter",
        "export_adapter",
        "merge_adapter",
    ),
    "curve": (
        "run_curve",
        "curve_image",
        "plot_selection",
    ),
    "request": (
        "SelectRequest",
        "run_select",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
