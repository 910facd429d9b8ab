"""Whether a failed model call is worth another try, and how long to wait before it.

Kept apart from the gateway (`dphil.agents.llm`) because it is pure policy: it reads an
exception and its headers, never litellm itself, so it is tested without a server.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from typing import Any

from dphil.agents.limits import Limits

# HTTP statuses worth another try: timeouts, conflicts, rate limits, server trouble.
_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
_RETRY_NAMES = {
    "RateLimitError",
    "Timeout",
    "APITimeoutError",
    "APIConnectionError",
    "InternalServerError",
    "ServiceUnavailableError",
    "BadGatewayError",
    "TimeoutError",
    "ConnectError",
    "ReadError",
    "RemoteProtocolError",
    "ServerDisconnectedError",
    "ClientConnectionError",
}
_NO_CREDENTIALS = re.compile(
    r"missing credentials|api[_ ]?key (?:is )?(?:missing|not set|required)|no api key",
    re.IGNORECASE,
)


def backoff_delay(attempt: int, retry_after: float | None, limits: Limits) -> float:
    """Full-jitter exponential backoff, never shorter than the server's Retry-After."""
    ceiling = min(limits.backoff_max, limits.backoff * (2**attempt))
    delay = random.uniform(ceiling / 2, ceiling)
    if retry_after is not None:
        delay = max(delay, min(retry_after, limits.retry_after_max))
    return delay


def classify(error: BaseException) -> tuple[bool, float | None]:
    """(worth retrying, seconds the server asked us to wait)."""
    status = getattr(error, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(error, "response", None), "status_code", None)
    names = {cls.__name__ for cls in type(error).__mro__}
    if _NO_CREDENTIALS.search(str(error)):
        retryable = False  # litellm reports a missing key as a server error; waiting won't help
    elif isinstance(status, int) and status in _RETRY_STATUS:
        retryable = True
    elif isinstance(status, int) and 400 <= status < 500:
        retryable = False
    else:
        retryable = bool(names & _RETRY_NAMES) or isinstance(error, (TimeoutError, OSError))
    # litellm keeps a 429's headers in `litellm_response_headers`; openai's on `response`.
    wait = None
    for headers in (
        getattr(error, "litellm_response_headers", None),
        getattr(getattr(error, "response", None), "headers", None),
    ):
        wait = retry_after_seconds(headers)
        if wait is not None:
            break
    return retryable, wait


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `Retry-After` (seconds or an HTTP date), else None."""
    if not headers:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(float(ms) / 1000.0, 0.0)
        value = headers.get("retry-after")
    except (AttributeError, ValueError, TypeError):
        return None
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)
