"""Writing files so that readers see the old contents or the new, never half of either.

Every output a command names (`-o FILE`, plots, run settings, exports) is
written to a temporary file beside its target and renamed over it only once
complete; on failure the temporary file is removed and the target is untouched.
A disk that fills up while writing is exit 74 with one line naming the target,
whichever library was writing (`is_disk_full`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dphil.io.errors import DphilError, OutputError

# errno values and the words libraries use for them (safetensors: "No space left on device
# (os error 28)"; shutil.Error lists the OSErrors it met as text).
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded")
DISK_FULL = "No space left on device"


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (or an exception it was raised from) is a full disk or quota: ENOSPC or
    EDQUOT from the OS, or a library's error that says so in words (SafetensorError)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        text = str(e)
        if any(word in text for word in _DISK_FULL_WORDS):
            return True
        e = e.__cause__ or e.__context__
    return False


def disk_full_error(path: str | os.PathLike, error: BaseException, what: str = "cannot write") -> OutputError:
    """One line (exit 74) naming `path` for a full disk, whatever library's error said so."""
    why = error.strerror if isinstance(error, OSError) and error.strerror else DISK_FULL
    return OutputError(f"{path}: {what}: {why}")


def current_umask() -> int:
    """The process umask (reading it means setting it; it is put straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_special(path: str | os.PathLike) -> bool:
    """A target that exists and is not a regular file (/dev/null, a FIFO, a terminal).

    Such a target is written in place: renaming a temporary file over it would replace
    the device or pipe itself (as root, `-o /dev/null` would leave a plain file there).
    """
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def make_parents(path: str | os.PathLike) -> None:
    """Create the directories an output will live in (`-o runs/a/ep.jsonl`, `--run-dir runs/q14`)."""
    parent = Path(path).parent
    if parent.is_dir():
        return
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{path}: cannot create its directory {parent}: {e.strerror}") from None


def temp_beside(path: str | os.PathLike) -> tuple[int, str]:
    """Create a temporary file in the target's directory (same file system, so rename is atomic).

    It gets the permissions a plain `open(path, "w")` would give, not mkstemp's 0600.
    """
    target = Path(path)
    make_parents(target)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.resolve().parent)
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror}") from None
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def publish(tmp: str, path: str | os.PathLike) -> None:
    """Rename a finished temporary file over its target."""
    try:
        os.replace(tmp, path)
    except OSError as e:
        discard(tmp)
        raise OutputError(f"{path}: cannot rename into place: {e.strerror}") from None


def discard(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """`with atomic_file(p) as fh: fh.write(...)`: p appears complete on success, unchanged on failure."""
    if is_special(path):
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
        except Exception as e:
            if not isinstance(e, DphilError) and is_disk_full(e):
                raise disk_full_error(path, e) from None
            raise
        return
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
    except BaseException as e:
        discard(tmp)
        if isinstance(e, Exception) and not isinstance(e, DphilError) and is_disk_full(e):
            raise disk_full_error(path, e) from None
        raise
    publish(tmp, path)
