"""Results: scored episodes read into cells and comparisons, the statistics, and the report writers."""

from dphil._face import lazy_face

_EXPORTS = {
    "cells": (
        "Compare",
        "Episodes",
        "load",
        "cell_records",
        "comparison_records",
    ),
    "maths": (
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
        "plot",
    ),
    "html_report": ("render_page",),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
