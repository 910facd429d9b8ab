"""One writer per output: an exclusive advisory lock beside every file or directory a run writes.

Two cron runs of the same `dphil-rollout -o grid.jsonl --resume` would otherwise both
read the journal, both see the same episodes missing and both append them. The lock
is `fcntl.flock` on `PATH.lock`, which the kernel releases when its holder dies (even
by SIGKILL), so a killed run never blocks the next one. The file records the holder's
pid for the message a second writer prints.

The holder removes the lock file when it finishes. That is safe because a taker
checks, once it holds the lock, that the path still names the file it locked (the
usual unlink race: it may have locked a file its predecessor had just removed), and
starts again if not.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from dphil.io.atomic import is_special, make_parents
from dphil.io.errors import EX_CANTCREAT, EX_TEMPFAIL, DphilError, OutputError

SUFFIX = ".lock"
POLL_SECONDS = 0.05


class LockBusy(DphilError):
    """Another process writes this output (exit 75: try again later)."""

    exit_code = EX_TEMPFAIL


class LockUnavailable(DphilError):
    """The lock file cannot be created, e.g. in a read-only directory (exit 73)."""

    exit_code = EX_CANTCREAT


def lock_path(target: str | os.PathLike) -> Path:
    """Where the lock of `target` lives: `target.lock` beside it (a directory's too)."""
    p = Path(target)
    return p.with_name(p.name.rstrip("/") + SUFFIX)


class OutputLock:
    """An exclusive lock on one output, held from `acquire()` to `release()`."""

    def __init__(self, target: str | os.PathLike) -> None:
        self.target = str(target)
        self.path = lock_path(target)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> int | None:
        """Take the lock if it is free: None on success, else the holder's pid (0: unknown)."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise LockUnavailable(f"{self.target}: cannot lock {self.path}: {e.strerror}") from None
                holder = _read_pid(fd)
                os.close(fd)
                return holder
            if not _still_named(fd, self.path):
                os.close(fd)  # a finishing holder removed the file we locked: lock the new one
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd
            return None

    def acquire(self, wait: float = 0.0, *, on_wait: Callable[[int], None] | None = None) -> None:
        """Take the lock, waiting up to `wait` seconds for its holder; LockBusy if still held."""
        deadline = time.monotonic() + max(wait, 0.0)
        told = False
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                who = f"pid {holder}" if holder else "another process"
                if wait > 0:
                    raise LockBusy(
                        f"{self.target}: still being written by {who} after waiting {wait:g} s (lock file {self.path})"
                    )
                raise LockBusy(
                    f"{self.target}: being written by {who} (lock file {self.path}); "
                    "wait for it with --wait-lock SECONDS"
                )
            if not told and on_wait is not None:
                on_wait(holder)
                told = True
            time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))

    def release(self) -> None:
        """Remove the lock file and let go (removing first, so a waiter re-checks the path)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if _still_named(fd, self.path):
                os.unlink(self.path)
        os.close(fd)

    def _open(self) -> int:
        try:
            make_parents(self.path)
        except OutputError as e:
            raise LockUnavailable(f"{self.target}: cannot create the lock file {self.path}: {e.message}") from None
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise LockUnavailable(f"{self.target}: cannot create the lock file {self.path}: {e.strerror}") from None

    def __enter__(self) -> OutputLock:
        if not self.held:
            self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def locked(
    targets: Iterable[str | os.PathLike | None], wait: float = 0.0, on_wait: Callable[[str, int], None] | None = None
) -> Iterator[list[OutputLock]]:
    """Hold the locks of every named output (None and `-` mean stdout: nothing to lock).

    A device or FIFO (`-o /dev/null`) is written in place and is not a journal, so it
    takes no lock: `/dev/null.lock` would be a stray file in /dev (and exit 73 for a
    user who cannot write there).

    Locks are taken in a fixed order (sorted by lock path), so two runs naming the
    same outputs cannot deadlock, each waiting up to `wait` seconds, and all are
    released on the way out.
    """
    wanted = sorted(
        {str(lock_path(t)): t for t in targets if t is not None and str(t) != "-" and not is_special(t)}.items()
    )
    held: list[OutputLock] = []
    try:
        for _, target in wanted:
            lock = OutputLock(target)
            notify = (lambda pid, t=str(target): on_wait(t, pid)) if on_wait else None
            lock.acquire(wait, on_wait=notify)
            held.append(lock)
        yield held
    finally:
        for lock in reversed(held):
            lock.release()


def _read_pid(fd: int) -> int:
    """The holder's pid from the lock file; it writes it just after locking, so look twice."""
    for _ in range(20):
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            return 0
        if text.isdigit():
            return int(text)
        time.sleep(0.005)
    return 0


def _still_named(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)
