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
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from dphil.agents.capped import guarded
from dphil.agents.limits import DEFAULT_TIMEOUT, Limits, RateLimiter, estimate_tokens
from dphil.agents.reasons import describe
from dphil.agents.redaction import known_secrets, redact
from dphil.agents.registry import ALLOWED_PARAMS, ModelSpec, check_params, public_url
from dphil.agents.retry import backoff_delay, classify
from dphil.io.errors import EX_UNAVAILABLE, DphilError, MissingExtraError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

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
        estimate = estimate_tokens(messages, tools) if self._limiter else 0
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
