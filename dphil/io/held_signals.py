"""Ctrl-C and SIGTERM held back while a write is part-done.

Python raises a signal's exception between any two bytecodes, including between
`os.write` returning a partial count and the caller recording it: a writer that
catches the exception then cannot know where in a line the pipe stopped, and a
reader may be left half a line. Inside `HeldSignals`, the first SIGINT or SIGTERM
is only noted (an interrupted write simply resumes, PEP 475); the writer looks at
`pending` at line boundaries and stops there, and leaving the block delivers the
signal through the handler that was in place. A second signal is not held: it
goes to that handler at once, so a reader that never reads cannot keep a command
from stopping.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

HELD = (signal.SIGINT, signal.SIGTERM)


class HeldSignals:
    """Hold the first SIGINT/SIGTERM for the duration of a `with` block.

    Only Python-level handlers are held (the default KeyboardInterrupt, the console's
    Terminated): an ignored signal stays ignored and a default-action one still ends the
    process. Outside the main thread, where handlers cannot be set, nothing is held.
    """

    def __init__(self) -> None:
        self.pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> HeldSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for signum in HELD:
                handler = signal.getsignal(signum)
                if callable(handler):
                    self._previous[signum] = handler
                    signal.signal(signum, self._note)
        except BaseException:  # a signal while setting up: leave every handler as it was
            self.__exit__(None, None, None)
            raise
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is not None:  # the second signal: stop now, part-done or not
            self._previous[signum](signum, frame)
        self.pending = signum

    def __exit__(self, exc_type, exc, tb) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        pending, self.pending = self.pending, None
        if pending is not None and exc_type is None:
            signal.raise_signal(pending)  # runs the restored handler, which raises here
