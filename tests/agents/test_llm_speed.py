"""What bench/bench_llm.py compares is like with like: dphil's Gateway, through litellm's
`hosted_vllm/` handler (how the registry reaches OpenAI-compatible servers) and through its
`openai/` provider, puts the same request on the wire as a bare openai.AsyncOpenAI call, and
both litellm paths give complete per-turn accounting. Timings live in bench/, not here."""

from __future__ import annotations

import asyncio

import openai
import pytest

from dphil.agents.limits import Limits
from dphil.agents.llm import Gateway, LLMCallError
from dphil.agents.prompts import builtin_prompt, observation_text
from dphil.agents.redaction import REDACTED
from dphil.agents.registry import ModelSpec
from dphil.agents.tools import tool_specs
from dphil.core.table import Table
from tests.support.openai_server import OpenAIServer, Reply, status, tool

KEY = "sk-speed-0123456789abcdef"
PATHS = ("hosted_vllm", "openai")


@pytest.fixture(scope="module")
def server():
    with OpenAIServer() as s:
        yield s


def bench_messages() -> list[dict]:
    prompt = builtin_prompt()
    return [
        {"role": "system", "content": prompt.system("paper", 5, 0)},
        {"role": "user", "content": observation_text(Table(5, 5).observe(0))},
    ]


def spec_for(server: OpenAIServer, provider: str, name: str) -> ModelSpec:
    return ModelSpec(name=name, model=f"{provider}/{name}", api_base=server.url, api_key_env="DPHIL_SPEED_KEY")


def bodies(server: OpenAIServer, model: str) -> list[dict]:
    return [r["body"] for r in server.requests if r["body"]["model"] == model]


@pytest.mark.parametrize("provider", PATHS)
def test_gateway_sends_what_a_bare_client_sends(server, monkeypatch, provider):
    monkeypatch.setenv("DPHIL_SPEED_KEY", KEY)
    msgs, tools = bench_messages(), tool_specs("paper")
    mine, bare = f"speed-{provider}", f"bare-{provider}"

    async def go():
        await Gateway(Limits(concurrency=2)).complete(spec_for(server, provider, mine), msgs, tools=tools)
        client = openai.AsyncOpenAI(base_url=server.url, api_key=KEY, max_retries=0)
        await client.chat.completions.create(model=bare, messages=msgs, tools=tools)
        await client.close()

    asyncio.run(go())
    (sent,), (reference,) = bodies(server, mine), bodies(server, bare)
    reference["model"] = mine
    assert sent == reference
    auth = {r["authorization"] for r in server.requests if r["body"]["model"] in (mine, bare)}
    assert auth == {f"Bearer {KEY}"}


@pytest.mark.parametrize("provider", PATHS)
def test_both_paths_account_for_every_turn(server, monkeypatch, provider):
    monkeypatch.setenv("DPHIL_SPEED_KEY", KEY)
    name = f"acct-{provider}"
    server.script(name, status(503), Reply(tools=(("eat", "{}"),), usage=(321, 7)))
    gateway = Gateway(Limits(concurrency=2, retries=2, backoff=0.01, backoff_max=0.02))
    c = asyncio.run(gateway.complete(spec_for(server, provider, name), bench_messages(), tools=tool_specs("paper")))
    assert [t["function"]["name"] for t in c.tool_calls] == ["eat"]
    assert (c.prompt_tokens, c.completion_tokens, c.retries, c.cost) == (321, 7, 1, 0.0)
    assert c.latency_s > 0
    assert (gateway.stats.calls, gateway.stats.retries, gateway.stats.prompt_tokens) == (1, 1, 321)


@pytest.mark.parametrize("provider", PATHS)
def test_a_failure_masks_every_secret_in_the_environment(server, monkeypatch, provider):
    # The environment is scanned for secrets only once a call has failed; it must still be.
    # The value is not key-shaped: only the scan of the environment can catch it.
    monkeypatch.setenv("DPHIL_SPEED_KEY", KEY)
    monkeypatch.setenv("SOME_OTHER_TOKEN", "zz9f8e7d6c5b4a")
    name = f"fail-zz9f8e7d6c5b4a-{provider}"
    server.script(name, status(400))
    with pytest.raises(LLMCallError) as info:
        asyncio.run(
            Gateway(Limits(retries=0)).complete(spec_for(server, provider, name), [{"role": "user", "content": "hi"}])
        )
    reason = info.value.reason
    assert "zz9f8e7d6c5b4a" not in reason and KEY not in reason
    # The reason names the server it could not get an answer from.
    assert reason.startswith(f"fail-{REDACTED}-{provider} at {server.url}: failed on 1 attempt(s)")


def test_priced_model_cost_is_litellms(server, monkeypatch):
    monkeypatch.setenv("DPHIL_SPEED_KEY", KEY)
    server.script("gpt-4o-mini", tool("think"))
    spec = ModelSpec(name="mini", model="openai/gpt-4o-mini", api_base=server.url, api_key_env="DPHIL_SPEED_KEY")
    c = asyncio.run(Gateway().complete(spec, bench_messages(), tools=tool_specs("paper")))
    import litellm

    prompt, completion = litellm.cost_per_token(
        model="gpt-4o-mini", prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens
    )
    assert c.cost == pytest.approx(prompt + completion, rel=1e-9) and c.cost > 0
