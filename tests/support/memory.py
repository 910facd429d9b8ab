"""A command's own peak memory, measured so that the test runner's size does not leak into it.

Linux carries a parent's memory high-water mark into a vfork()ed child's ru_maxrss across
exec, so a command started by a large pytest process (torch and models loaded by earlier
tests) would report pytest's peak as its own. A small fresh interpreter forks the command
instead and writes the command's own peak (KiB) to a file.
"""

from __future__ import annotations

import sys
from pathlib import Path

MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


def measured(peak_file: Path, argv: list[str]) -> list[str]:
    """The argv that runs `argv` (an absolute program path first) and leaves its peak RSS in `peak_file`."""
    return [sys.executable, "-c", MEASURE, str(peak_file), *argv]


def peak_mib(peak_file: Path) -> int:
    return int(peak_file.read_text()) // 1024
