"""How every command talks to its environment: messages, exit codes, signals.

Like httpie's `Environment`, one object knows the standard streams, whether
stderr is a terminal and whether the user asked for quiet, so commands never
print directly. `run` turns any failure into one stderr line and a sysexits
status: stdout carries records and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import IO

from dphil.io.atomic import is_disk_full
from dphil.io.errors import EX_INTERRUPTED, EX_IOERR, EX_SOFTWARE, DphilError
from dphil.io.safe import for_terminal


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM arrives, so cleanup code runs like for Ctrl-C.

    A KeyboardInterrupt so that asyncio lets it through: its event loop re-raises only
    KeyboardInterrupt and SystemExit from a callback or task step and logs and swallows any
    other BaseException, which let a SIGTERM landing mid-step leave a model run going.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Console:
    """The streams of one command run and how chatty it may be."""

    def __init__(self, prog: str, *, quiet: bool = False, stderr: IO[str] | None = None) -> None:
        self.prog = prog
        self.quiet = quiet
        self.stderr = stderr if stderr is not None else sys.stderr

    @property
    def stderr_is_tty(self) -> bool:
        try:
            return self.stderr.isatty()
        except (AttributeError, ValueError):
            return False

    @property
    def show_progress(self) -> bool:
        """Progress bars only on a terminal, and never with -q."""
        return not self.quiet and self.stderr_is_tty

    def report(self, message: str) -> None:
        """What a run wrote and where, for a person at a terminal (not for logs or pipes; not with -q).

        A message of several lines (a results table) is shown as it is, without the prefix."""
        if not self.show_progress:
            return
        if "\n" not in message:
            self.error(message)
            return
        with contextlib.suppress(OSError, ValueError):
            print("\n".join(map(for_terminal, message.splitlines())), file=self.stderr, flush=True)

    def warn(self, message: str) -> None:
        """A message for the user; silenced by -q."""
        if not self.quiet:
            self.error(message)

    def error(self, message: str) -> None:
        """A message that is always shown: one line, whatever a server or a record put in it
        (control characters and escape sequences are shown, never obeyed)."""
        with contextlib.suppress(OSError, ValueError):
            print(f"{self.prog}: {for_terminal(message)}", file=self.stderr, flush=True)


def run(console: Console, body: Callable[[], int | None]) -> int:
    """Run a command body and return its exit status, reporting failures on one line."""
    previous = _install_sigterm()
    try:
        return body() or 0
    except DphilError as e:
        console.error(e.message)
        return e.exit_code
    except BrokenPipeError:
        # `| head` closed the pipe: leave quietly, and keep Python from complaining at exit.
        _silence_stdout()
        return 0
    except Terminated as t:  # before KeyboardInterrupt, which it is
        console.error("terminated")
        return 128 + t.signum
    except KeyboardInterrupt:
        console.error("interrupted")
        return EX_INTERRUPTED
    except MemoryError:
        console.error("out of memory")
        return EX_SOFTWARE
    except OSError as e:
        # A full disk where no writer named its file (a journal, a library's own write): still
        # one line and exit 74, never an internal error.
        if not is_disk_full(e):
            console.error(f"internal error: {type(e).__name__}: {e}")
            return EX_SOFTWARE
        console.error(f"{e.filename or 'output'}: no space left on device")
        return EX_IOERR
    except Exception as e:  # a bug: say so plainly, with the type, on one line
        console.error(f"internal error: {type(e).__name__}: {e}")
        return EX_SOFTWARE
    finally:
        _restore_sigterm(previous)


def _raise_terminated(signum, _frame) -> None:
    raise Terminated(signum)


def _install_sigterm():
    try:
        return signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread (e.g. inside a test runner's worker)
        return None


def _restore_sigterm(previous) -> None:
    if previous is not None:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, previous)


def output_name(path: object) -> str:
    """How a run's report names where it wrote: the path, or stdout for none and `-`."""
    return "stdout" if path is None or str(path) == "-" else str(path)


def stdin_has_data() -> bool:
    """Whether records are being piped into stdin right now (a pipe or file with bytes waiting).

    For commands that read no stdin: `dphil-score ep.jsonl | dphil-rollout ...` would otherwise
    drop the records silently. Never a false alarm: a terminal, /dev/null, a closed stdin, an
    empty or idle pipe all say no (nothing is consumed unless bytes are already there).
    """
    import select
    import stat

    try:
        mode = os.fstat(0).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
            return False
        if stat.S_ISREG(mode):
            return os.fstat(0).st_size > os.lseek(0, 0, os.SEEK_CUR)
        ready, _, _ = select.select([0], [], [], 0)
        return bool(ready) and os.read(0, 1) != b""
    except (OSError, ValueError):
        return False


def _silence_stdout() -> None:
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
