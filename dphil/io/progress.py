"""Progress where a person will look for it: a bar on a terminal, a line every 30 s in a log.

Slurm and cron send stderr to a file, where a progress bar is noise (carriage returns)
and no bar at all leaves a reader guessing whether a twelve-hour grid is moving. So on a
stderr that is not a terminal, progress is one plain line every `interval` seconds: done
of total, errors, rate and time left. `-q` silences both.
"""

from __future__ import annotations

import os
import threading
import time
from typing import IO, Any

INTERVAL = 30.0  # seconds between log lines; DPHIL_PROGRESS_SECONDS overrides it


class LogProgress:
    """tqdm's small interface (`update`, `set_postfix`, `close`), written as periodic log lines."""

    def __init__(self, prog: str, total: int, *, unit: str, stream: IO[str], interval: float = INTERVAL) -> None:
        self.prog, self.total, self.unit, self.stream = prog, total, unit, stream
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, args=(interval,), daemon=True, name="dphil-progress")
        self._thread.start()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        self.postfix = values

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.n}/{self.total} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        parts.append(f"{rate:.2f} {self.unit}/s")
        left = self.total - self.n
        if rate > 0 and left > 0:
            parts.append(f"ETA {_duration(left / rate)}")
        parts.append(f"elapsed {_duration(elapsed)}")
        return f"{self.prog}: " + ", ".join(parts)

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                print(self.line(), file=self.stream, flush=True)
            except (OSError, ValueError):  # the log went away: stop reporting, never fail the run
                return

    def close(self) -> None:
        self._stop.set()


def make_progress(console: Any, total: int, *, unit: str) -> Any:
    """A tqdm bar on a terminal, log lines elsewhere, nothing with -q."""
    if console.quiet:
        return None
    if console.stderr_is_tty:
        from tqdm import tqdm

        return tqdm(total=total, unit=unit, desc=unit, file=console.stderr)
    try:
        interval = float(os.environ.get("DPHIL_PROGRESS_SECONDS", INTERVAL))
    except ValueError:
        interval = INTERVAL
    return LogProgress(console.prog, total, unit=unit, stream=console.stderr, interval=max(interval, 0.1))


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
