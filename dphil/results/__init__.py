"""Results: scored episodes read into cells and comparisons, the statistics, and the report writers."""

from dphil._face import lazy_face

_EXPORTS = {
    "frame": (
        "Episodes",
        "load",
    ),
    "cells": ("cell_records",),
    "comparisons": (
        "Compare",
        "comparison_records",
    ),
    # The statistics live in dphil.core.maths; the results face still shows them.
    "dphil.core.maths": (
        "mean_ci",
        "welch",
        "hedges_g",
        "paired",
        "mcnemar",
        "adjust",
        "power",
        "sample_size",
    ),
    "report": (
        "render",
        "markdown",
        "table",
        "csv_text",
    ),
    "figure": ("plot",),
    "html_report": ("render_page",),
    "request": (
        "StatsRequest",
        "run_stats",
    ),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
