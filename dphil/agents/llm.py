"""Calling language models through litellm: bounded, rate-limited, retried, costed, redacted.

One `Gateway` is shared by every episode of a run, so `--concurrency` bounds the
calls in flight across all of them and `--rpm/--tpm` hold for the run as a whole.
A call that still fails after its retries raises `LLMCallError`: the episode
ends with `status: "error"`. It is never turned into a model's inaction, which
the published reward would pay as a perfect 1.0.

litellm is imported on the first call only (commands that do not call a model
stay fast), and only after `LITELLM_LOCAL_MODEL_COST_MAP` is set, so machines
without internet do not stall fetching litellm's price list.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import random
import re
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dphil.agents.capped import DEFAULT_MAX_REPLY_BYTES, guarded
from dphil.agents.reasons import describe
from dphil.agents.redaction import known_secrets, redact
from dphil.agents.registry import ALLOWED_PARAMS, ModelSpec, check_params, public_url
from dphil.io.errors import EX_UNAVAILABLE, DphilError, MissingExtraError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

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

_litellm: Any = None
_unpriced: set[str] = set()


class LLMCallError(DphilError):
    """A model call failed for good (after retries, or at once if retrying cannot help).

    Ends the episode with `status: "error"` and `error: <reason>`; the reason
    has every secret redacted.
    """

    exit_code = EX_UNAVAILABLE

    def __init__(self, reason: str, *, attempts: int = 1, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts
        self.retryable = retryable


def litellm_module() -> Any:
    """Import litellm on first use, quietly (its banners would corrupt a JSONL stdout)."""
    global _litellm
    if _litellm is None:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm
        except ImportError:
            raise MissingExtraError("calling language models needs litellm: pip install 'dphil[llm]'") from None
        _quiet_warnings()
        from dphil.agents.capped import install

        install()  # before litellm makes its first HTTP client
        litellm.suppress_debug_info = True
        litellm.telemetry = False
        litellm.set_verbose = False
        _litellm = litellm
    return _litellm


def _quiet_warnings() -> None:
    """litellm's own logging serialises every response and warns about its own types."""
    warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)


# -- limits ---------------------------------------------------------------------------------


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


# -- one call -------------------------------------------------------------------------------


@dataclass
class Completion:
    """One model reply and what it cost."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    reasoning: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    retries: int
    cost: float
    server: str | None = None  # which of several servers answered (a URL without secrets)
    cached_tokens: int | None = None  # of prompt_tokens, how many the server took from its cache

    @property
    def usage(self) -> dict[str, int]:
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        if self.cached_tokens is not None:
            out["cached_tokens"] = self.cached_tokens
        return out


@dataclass
class GatewayStats:
    calls: int = 0
    failed_calls: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0


@dataclass
class Gateway:
    """The run's single door to the models: concurrency, rate limits, retries, accounting."""

    limits: Limits = field(default_factory=Limits)
    stats: GatewayStats = field(default_factory=GatewayStats)

    def __post_init__(self) -> None:
        if self.limits.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        _quiet_warnings()
        self._semaphore = asyncio.Semaphore(self.limits.concurrency)
        self._limiter = RateLimiter(self.limits.rpm, self.limits.tpm) if self.limits.rpm or self.limits.tpm else None
        self._routers: dict[str, Any] = {}

    def _router(self, litellm: Any, spec: ModelSpec, key: str | None) -> Any:
        """The Router of a model served by several servers (made once per run and model)."""
        router = self._routers.get(spec.name)
        if router is None:
            from dphil.agents.router import make_router

            router = self._routers[spec.name] = make_router(litellm, spec, key)
        return router

    async def complete(
        self,
        spec: ModelSpec,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        slot: int | None = None,
    ) -> Completion:
        """One chat completion, retried when that can help; LLMCallError when it cannot be had.

        `slot`: on a llama.cpp server dphil started, the slot this conversation keeps, whose
        cached prompt the server extends instead of evaluating the whole prompt again."""
        litellm = litellm_module()
        limits = self.limits
        key = spec.api_key()
        if not spec.params.keys() <= ALLOWED_PARAMS.keys():  # a spec made in code, not read from a registry
            check_params(spec.params, f"model {spec.name!r}")
        timeout = limits.timeout or spec.timeout or DEFAULT_TIMEOUT
        kwargs: dict[str, Any] = {
            **spec.params,
            "model": spec.model,
            "messages": messages,
            "timeout": timeout,
            "max_retries": 0,
            "drop_params": True,
        }
        bases = spec.bases
        if len(bases) == 1:
            kwargs["api_base"] = bases[0]
        if key:
            kwargs["api_key"] = key
        if tools:
            kwargs["tools"] = tools
            if tool_choice:
                kwargs["tool_choice"] = tool_choice
        if slot is not None:
            kwargs["extra_body"] = {"id_slot": slot, "cache_prompt": True}
        if len(bases) > 1:  # several servers: litellm's Router picks one per call
            router = self._router(litellm, spec, key)
            kwargs["model"] = spec.name
            kwargs.pop("api_key", None)
            call = router.acompletion
        else:
            call = litellm.acompletion
        estimate = _estimate_tokens(messages, tools) if self._limiter else 0
        attempt = 0
        stats = self.stats
        while True:
            async with self._semaphore:
                entry = await self._limiter.acquire(estimate) if self._limiter else None
                stats.in_flight += 1
                stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
                start = time.monotonic()
                try:
                    # A hard deadline as well: a server that accepts the connection and then
                    # goes silent must not hold the slot for ever.
                    with guarded(limits.max_reply_bytes) as guard:
                        response = await asyncio.wait_for(call(**kwargs), timeout + 5.0)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # classified below: transient, or the episode's end
                    failure: BaseException | None = e
                else:
                    failure = None
                finally:
                    stats.in_flight -= 1
                latency = time.monotonic() - start
            if failure is None:
                completion = _completion(litellm, response, latency, attempt, spec)
                if len(bases) > 1:
                    hidden = getattr(response, "_hidden_params", None) or {}
                    completion.server = public_url(hidden.get("api_base"))
                if entry is not None:
                    RateLimiter.settle(entry, completion.prompt_tokens + completion.completion_tokens)
                stats.calls += 1
                stats.retries += attempt
                stats.prompt_tokens += completion.prompt_tokens
                stats.completion_tokens += completion.completion_tokens
                stats.cost += completion.cost
                return completion
            if guard.exceeded is not None:  # abandoned while reading: worth another try
                retryable, wait, why = True, None, guard.describe()
            else:
                (retryable, wait), why = classify(failure), describe(failure)
            if not retryable or attempt >= limits.retries:
                stats.failed_calls += 1
                stats.retries += attempt
                tries = attempt + 1
                what = "gave up after" if retryable else "failed on"
                # Which server(s) failed, without any credentials a URL may carry.
                where = f"{spec.name} at {', '.join(map(str, map(public_url, bases)))}" if bases else spec.name
                reason = f"{where}: {what} {tries} attempt(s): {why}"
                # Secrets are gathered only here, when a call has failed: scanning the
                # environment costs ~70 us, too much to pay on every successful call.
                raise LLMCallError(
                    redact(reason, known_secrets((key,))),
                    attempts=tries,
                    retryable=retryable,
                ) from None
            await asyncio.sleep(backoff_delay(attempt, wait, limits))
            attempt += 1


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


def _estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    return (len(json.dumps(messages)) + (len(json.dumps(tools)) if tools else 0)) // 4 + 64


def _completion(litellm: Any, response: Any, latency: float, retries: int, spec: ModelSpec) -> Completion:
    choice = response.choices[0]
    message = choice.message
    calls = []
    for k, call in enumerate(getattr(message, "tool_calls", None) or []):
        fn = call.function
        calls.append(
            {
                "id": getattr(call, "id", None) or f"call_{k}",
                "type": "function",
                "function": {"name": fn.name, "arguments": fn.arguments or ""},
            }
        )
    reasoning = getattr(message, "reasoning_content", None)
    usage = getattr(response, "usage", None)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    return Completion(
        cached_tokens=cached if isinstance(cached, int) and not isinstance(cached, bool) else None,
        content=message.content,
        tool_calls=calls,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        prompt_tokens=prompt,
        completion_tokens=completion,
        latency_s=round(latency, 4),
        retries=retries,
        cost=_cost(litellm, response, spec),
    )


def _cost(litellm: Any, response: Any, spec: ModelSpec) -> float:
    """litellm's price for the call; 0.0 for models it has no price for (local servers)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost")
    if isinstance(cost, int | float):
        return float(cost)
    if spec.model in _unpriced:
        return 0.0
    try:
        return float(litellm.completion_cost(completion_response=response, model=spec.model))
    except Exception:  # litellm raises a bare Exception for models it has no price for
        _unpriced.add(spec.model)
        return 0.0
