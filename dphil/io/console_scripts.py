"""Where dphil's installed commands are, for tests and benches that run them as real processes.

The commands of the Python that is running come first (a virtual environment
need not be on PATH), then PATH. One lookup, so the tests and every bench
find the same executable.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def locate(name: str) -> str | None:
    """The console script `name` (e.g. `dphil-rollout`) beside this Python, else on PATH; None if neither."""
    here = Path(sys.executable).parent
    return shutil.which(name, path=f"{here}{os.pathsep}{os.environ.get('PATH', '')}")
