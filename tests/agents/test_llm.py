"""The Gateway against a real OpenAI-compatible server through litellm (not mocked):
replies, retries, Retry-After, timeouts, dropped connections, limits, redaction, cost."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dphil.agents.limits import Limits, RateLimiter
from dphil.agents.llm import Gateway, LLMCallError
from dphil.agents.redaction import REDACTED, redact
from dphil.agents.registry import ModelSpec
from dphil.agents.retry import backoff_delay, retry_after_seconds
from dphil.agents.tools import tool_specs
from tests.support.openai_server import DROP, HANG, OpenAIServer, Reply, big, status, text, tool

KEY = "sk-test-0123456789abcdef"
FAST = Limits(concurrency=8, timeout=5, retries=3, backoff=0.01, backoff_max=0.05)
MESSAGES = [{"role": "system", "content": "You are philosopher 0."}, {"role": "user", "content": "Round 1 of 5."}]


@pytest.fixture(scope="module")
def server():
    with OpenAIServer() as s:
        yield s


@pytest.fixture
def spec(server, monkeypatch, request):
    monkeypatch.setenv("DPHIL_TEST_KEY", KEY)
    name = request.node.name.replace("[", "-").replace("]", "")
    return ModelSpec(name=name, model=f"openai/{name}", api_base=server.url, api_key_env="DPHIL_TEST_KEY")


def complete(spec, limits=FAST, **kw):
    async def go():
        return await Gateway(limits).complete(spec, MESSAGES, **kw)

    return asyncio.run(go())


def requests_for(server, spec):
    return [r for r in server.requests if r["body"]["model"] == spec.model.split("/", 1)[1]]


def test_tool_call_reply_usage_and_key_sent(server, spec):
    server.script(spec.model.split("/", 1)[1], tool("eat", "think", arguments='{"x": 1}'))
    c = complete(spec, tools=tool_specs("paper"))
    assert [t["function"]["name"] for t in c.tool_calls] == ["eat", "think"]
    assert c.tool_calls[0]["function"]["arguments"] == '{"x": 1}'
    assert c.tool_calls[0]["id"] == "call_0"
    assert c.prompt_tokens > 0 and c.completion_tokens > 0
    assert c.retries == 0 and c.latency_s >= 0 and c.cost == 0.0
    (req,) = requests_for(server, spec)
    assert req["authorization"] == f"Bearer {KEY}"
    assert [t["function"]["name"] for t in req["body"]["tools"]] == [
        "pick-up-left",
        "pick-up-right",
        "put-down-left",
        "put-down-right",
        "eat",
        "think",
    ]
    assert req["body"]["messages"] == MESSAGES


def test_text_and_reasoning_content(server, spec):
    server.script(spec.model.split("/", 1)[1], text("ACTION: eat", reasoning="I hold both."))
    c = complete(spec)
    assert c.content == "ACTION: eat"
    assert c.reasoning == "I hold both."
    assert c.tool_calls == []


def test_sampling_params_are_sent(server, monkeypatch):
    monkeypatch.setenv("DPHIL_TEST_KEY", KEY)
    s = ModelSpec(
        name="p",
        model="openai/sampling",
        api_base=server.url,
        api_key_env="DPHIL_TEST_KEY",
        params={"temperature": 0.25, "max_tokens": 77},
    )
    complete(s)
    body = requests_for(server, s)[-1]["body"]
    assert body["temperature"] == 0.25 and body["max_tokens"] == 77


def test_5xx_and_dropped_connections_are_retried(server, spec):
    server.script(spec.model.split("/", 1)[1], status(500), DROP, status(503), tool("think"))
    c = complete(spec, tools=tool_specs("paper"))
    assert c.retries == 3
    assert c.tool_calls[0]["function"]["name"] == "think"
    assert len(requests_for(server, spec)) == 4


def test_retry_after_is_honoured(server, spec):
    server.script(spec.model.split("/", 1)[1], status(429, retry_after="1"), text("wait"))
    start = time.monotonic()
    c = complete(spec)
    assert time.monotonic() - start >= 1.0  # backoff alone would be <= 0.05 s
    assert c.retries == 1 and c.content == "wait"
    times = [r["time"] for r in requests_for(server, spec)]
    assert times[1] - times[0] >= 1.0


def test_gives_up_after_retries_with_a_reason(server, spec):
    server.script(spec.model.split("/", 1)[1], *[status(500)] * 4)
    with pytest.raises(LLMCallError) as info:
        complete(spec)
    e = info.value
    assert e.attempts == 4 and e.retryable
    assert "gave up after 4 attempt(s)" in e.reason and "500" in e.reason
    assert e.exit_code == 69


def test_client_errors_are_not_retried(server, spec):
    server.script(spec.model.split("/", 1)[1], status(400), text("never reached"))
    with pytest.raises(LLMCallError, match="failed on 1 attempt"):
        complete(spec)
    assert len(requests_for(server, spec)) == 1
    assert complete(spec).content == "never reached"  # still queued: no retry consumed it
    server.script(spec.model.split("/", 1)[1], status(401))
    with pytest.raises(LLMCallError, match="AuthenticationError"):
        complete(spec)


def test_a_hanging_server_times_out_and_the_call_fails(server, spec):
    server.script(spec.model.split("/", 1)[1], HANG, HANG)
    limits = Limits(timeout=0.4, retries=1, backoff=0.01, backoff_max=0.01)
    start = time.monotonic()
    with pytest.raises(LLMCallError, match="gave up after 2 attempt"):
        complete(spec, limits)
    assert 0.8 <= time.monotonic() - start < 60  # it ends: each try stops at --timeout


def test_the_model_s_own_timeout_applies_unless_the_run_sets_one(server, spec):
    """A registry `timeout` is the model's: a CPU model may need minutes, an API seconds."""
    from dataclasses import replace

    patient = replace(spec, timeout=0.4)
    server.script(spec.model.split("/", 1)[1], HANG, HANG)
    start = time.monotonic()
    with pytest.raises(LLMCallError, match="gave up after 2 attempt"):
        complete(patient, Limits(retries=1, backoff=0.01, backoff_max=0.01))  # no run timeout
    assert 0.8 <= time.monotonic() - start < 60  # 0.4 s per try, not the default 120
    # The run's --timeout wins over the model's: here the model's 0.4 s would have given up.
    server.script(spec.model.split("/", 1)[1], HANG)
    server.script(spec.model.split("/", 1)[1], tool("eat"))
    c = complete(replace(spec, timeout=1e-3), Limits(timeout=0.4, retries=2, backoff=0.01, backoff_max=0.01))
    assert c.retries == 1 and c.tool_calls[0]["function"]["name"] == "eat"


def test_a_hang_then_an_answer_succeeds(server, spec):
    server.script(spec.model.split("/", 1)[1], HANG, tool("eat"))
    c = complete(spec, Limits(timeout=0.4, retries=2, backoff=0.01, backoff_max=0.01))
    assert c.retries == 1 and c.tool_calls[0]["function"]["name"] == "eat"


def test_api_key_never_appears_in_errors(server, monkeypatch):
    secret = "sk-live-SUPERSECRET-987654321"
    monkeypatch.setenv("DPHIL_SECRET_KEY", secret)
    s = ModelSpec(name="leaky", model="openai/leaky", api_base=server.url, api_key_env="DPHIL_SECRET_KEY")
    # A server that echoes the key back in its error, as some providers do.
    server.script("leaky", status(401))
    with pytest.raises(LLMCallError) as info:
        complete(s)
    assert secret not in str(info.value)
    assert redact(f"Incorrect API key provided: {secret}") == f"Incorrect API key provided: {REDACTED}"
    assert redact("Authorization: Bearer abcdefghijklmnop") == f"Authorization: Bearer {REDACTED}"
    assert redact("GET /v1?key=AIzaSyA-1234567890abcdefghijkl&alt=sse") == f"GET /v1?key={REDACTED}&alt=sse"


def test_missing_key_fails_at_once(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    s = ModelSpec(name="nokey", model="openai/nokey", api_base=server.url, api_key_env="DPHIL_UNSET_KEY")
    with pytest.raises(LLMCallError, match="failed on 1 attempt"):
        complete(s)


def test_concurrency_bounds_calls_in_flight(monkeypatch):
    monkeypatch.setenv("DPHIL_TEST_KEY", KEY)
    with OpenAIServer() as s, ThreadPoolExecutor(1) as pool:
        spec = ModelSpec(name="c", model="openai/c", api_base=s.url, api_key_env="DPHIL_TEST_KEY")
        gw_holder = {}

        async def go():
            gw = Gateway(Limits(concurrency=3, timeout=30))
            gw_holder["gw"] = gw
            await asyncio.gather(*(gw.complete(spec, MESSAGES) for _ in range(12)))

        s.hold_after(0)  # held calls fill the three slots; a fourth must not be sent
        running = pool.submit(asyncio.run, go())
        assert s.wait_arrived(3)
        assert not s.wait_arrived(4, timeout=0.5)
        assert gw_holder["gw"].stats.in_flight == 3
        s.release()
        running.result(timeout=300)
        assert s.max_in_flight == 3
        assert gw_holder["gw"].stats.max_in_flight == 3
        assert gw_holder["gw"].stats.calls == 12


def test_rpm_limiter_spaces_calls(monkeypatch):
    RateLimiter.WINDOW = 0.5  # a half-second "minute" keeps the test quick
    try:

        async def go():
            limiter = RateLimiter(rpm=2, tpm=None)
            stamps = []
            for _ in range(5):
                await limiter.acquire(10)
                stamps.append(time.monotonic())
            return stamps

        stamps = asyncio.run(go())
    finally:
        RateLimiter.WINDOW = 60.0
    # At most 2 calls in any 0.5 s window: calls 3 and 5 wait for the window to move.
    assert stamps[2] - stamps[0] >= 0.49
    assert stamps[4] - stamps[2] >= 0.49


def test_tpm_limiter_counts_reported_tokens():
    RateLimiter.WINDOW = 0.4
    try:

        async def go():
            limiter = RateLimiter(rpm=None, tpm=100)
            entry = await limiter.acquire(10)
            RateLimiter.settle(entry, 95)  # the call used more than estimated
            t0 = time.monotonic()
            await limiter.acquire(10)
            return time.monotonic() - t0

        waited = asyncio.run(go())
    finally:
        RateLimiter.WINDOW = 60.0
    assert waited >= 0.35


def test_backoff_and_retry_after_parsing():
    limits = Limits(backoff=1.0, backoff_max=8.0, retry_after_max=30)
    for attempt, hi in [(0, 1.0), (1, 2.0), (2, 4.0), (5, 8.0)]:
        d = backoff_delay(attempt, None, limits)
        assert hi / 2 <= d <= hi
    assert backoff_delay(0, 12.0, limits) == 12.0
    assert backoff_delay(0, 3600.0, limits) == 30
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds(None) is None


def test_cost_of_a_priced_model_comes_from_litellm(server, monkeypatch):
    monkeypatch.setenv("DPHIL_TEST_KEY", KEY)
    s = ModelSpec(name="mini", model="openai/gpt-4o-mini", api_base=server.url, api_key_env="DPHIL_TEST_KEY")
    server.script("gpt-4o-mini", Reply(text="ACTION: think", usage=(1000, 1000)))
    c = complete(s)
    # gpt-4o-mini in litellm's bundled price map: $0.15 / 1M input, $0.60 / 1M output.
    assert c.cost == pytest.approx(1000 * 0.15e-6 + 1000 * 0.60e-6, rel=1e-6)


# -- the server's own reasons, and replies too large to hold ---------------------------------

PINNED = {"detail": "Server is pinned to '/models/x'; requested 'x'"}
OOM = {"error": {"message": "CUDA out of memory. Tried to allocate 2.00 GiB", "type": "server_error"}}


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
def test_the_servers_message_reaches_the_reason_for_4xx_and_5xx(server, monkeypatch, provider):
    monkeypatch.setenv("DPHIL_TEST_KEY", KEY)
    name = f"reasons-{provider}"
    s = ModelSpec(name=name, model=f"{provider}/{name}", api_base=server.url, api_key_env="DPHIL_TEST_KEY")
    server.script(name, status(400, body=PINNED), status(500, body=OOM), status(500, body=OOM))
    with pytest.raises(LLMCallError) as info:
        complete(s, Limits(retries=1, backoff=0.01, backoff_max=0.01))
    assert "failed on 1 attempt" in info.value.reason
    assert "(HTTP 400): Server is pinned to '/models/x'; requested 'x'" in info.value.reason
    with pytest.raises(LLMCallError) as info:
        complete(s, Limits(retries=1, backoff=0.01, backoff_max=0.01))
    assert "gave up after 2 attempt" in info.value.reason
    assert "(HTTP 500): CUDA out of memory. Tried to allocate 2.00 GiB" in info.value.reason


def test_a_long_server_message_is_cut_and_a_key_it_echoes_is_redacted(server, monkeypatch):
    secret = "sk-live-ECHOED-0123456789abcdef"
    monkeypatch.setenv("DPHIL_ECHO_KEY", secret)
    s = ModelSpec(name="echo", model="openai/echo", api_base=server.url, api_key_env="DPHIL_ECHO_KEY")
    said = f"Incorrect API key provided: {secret}. " + "You can find your key in settings. " * 30
    server.script("echo", status(401, body={"error": {"message": said}}))
    with pytest.raises(LLMCallError) as info:
        complete(s)
    reason = info.value.reason
    assert secret not in reason and f"Incorrect API key provided: {REDACTED}" in reason
    assert reason.endswith("…") and len(reason) < 420


def test_an_oversized_reply_is_abandoned_while_reading_and_retried(server, spec):
    name = spec.model.split("/", 1)[1]
    limits = Limits(retries=1, backoff=0.01, backoff_max=0.01, max_reply_bytes=1 << 20)
    server.script(name, big(50 << 20), text("ACTION: eat"))
    c = complete(spec, limits)
    assert c.retries == 1 and c.content == "ACTION: eat"
    server.script(name, big(50 << 20), big(50 << 20))
    with pytest.raises(LLMCallError) as info:
        complete(spec, limits)
    assert "gave up after 2 attempt(s): reply too large: more than 1,048,576 bytes" in info.value.reason
    assert "--max-reply-bytes" in info.value.reason


def test_a_reply_announced_too_large_is_refused_before_reading(server, spec):
    name = spec.model.split("/", 1)[1]
    server.script(name, text("x" * (2 << 20)))  # a plain JSON reply: it has a Content-Length
    with pytest.raises(LLMCallError, match="reply too large: more than 1,048,576 bytes"):
        complete(spec, Limits(retries=0, max_reply_bytes=1 << 20))
    assert complete(spec, Limits(retries=0, max_reply_bytes=1 << 20)).content  # the next one is fine
