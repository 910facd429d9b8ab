"""How hard a run may press the providers: the `Limits` a Gateway keeps, and its rate limiter.

Apart from the gateway (`dphil.agents.llm`) so that a run's options can be turned into
`Limits` without importing the call machinery, and so the sliding window reads on its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from dphil.agents.capped import DEFAULT_MAX_REPLY_BYTES

DEFAULT_TIMEOUT = 120.0  # seconds per call when neither the run nor the model says


@dataclass(frozen=True)
class Limits:
    """How hard a run may press the providers, and how patiently it retries."""

    concurrency: int = 16
    rpm: int | None = None
    tpm: int | None = None
    timeout: float | None = None  # None: the model's own (`ModelSpec.timeout`), else DEFAULT_TIMEOUT
    retries: int = 4
    backoff: float = 1.0
    backoff_max: float = 60.0
    retry_after_max: float = 600.0
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES


class RateLimiter:
    """Requests and tokens per minute over a sliding 60-second window.

    Tokens are estimated from the prompt before a call and corrected with the
    reported usage after it.
    """

    WINDOW = 60.0

    def __init__(self, rpm: int | None, tpm: int | None) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._events: deque[list[float]] = deque()  # [time, tokens]
        self._lock = asyncio.Lock()

    async def acquire(self, tokens: int) -> list[float]:
        async with self._lock:
            while True:
                now = time.monotonic()
                events = self._events
                while events and events[0][0] <= now - self.WINDOW:
                    events.popleft()
                rpm_ok = self.rpm is None or len(events) < self.rpm
                used = sum(e[1] for e in events) if self.tpm is not None else 0
                tpm_ok = self.tpm is None or not events or used + tokens <= self.tpm
                if rpm_ok and tpm_ok:
                    entry = [now, float(tokens)]
                    events.append(entry)
                    return entry
                await asyncio.sleep(max(events[0][0] + self.WINDOW - now, 0.005))

    @staticmethod
    def settle(entry: list[float], tokens: int) -> None:
        entry[1] = float(tokens)


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """A call's tokens guessed before it is made (about four characters a token), for `--tpm`."""
    return (len(json.dumps(messages)) + (len(json.dumps(tools)) if tools else 0)) // 4 + 64
