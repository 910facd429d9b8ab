"""Input and output every command shares: JSONL records, atomic writes, locks, the console, exit codes.

The bottom layer: it imports nothing else of dphil, and nothing here is heavy.
"""

from dphil._face import lazy_face

_EXPORTS = {
    "errors": (
        "DphilError",
        "UsageError",
        "DataError",
        "NoInputError",
        "OutputError",
        "ConfigError",
        "MissingExtraError",
    ),
    "jsonl": (
        "RecordReader",
        "RecordWriter",
        "open_input",
        "dumps",
        "MAX_LINE",
    ),
    "atomic": (
        "atomic_file",
        "publish",
    ),
    "lock": (
        "OutputLock",
        "locked",
        "LockBusy",
    ),
    "console": (
        "Console",
        "run",
        "Terminated",
    ),
    "console_scripts": ("locate",),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
