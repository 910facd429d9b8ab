"""Whole episodes with model philosophers, through litellm against a real local server."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from dphil.agents.agent import AgentSettings
from dphil.agents.limits import Limits
from dphil.agents.llm import Gateway
from dphil.agents.prompts import builtin_prompt
from dphil.agents.registry import ModelSpec
from dphil.agents.runner import (
    TooManyErrors,
    model_variant,
    play_episode,
    run_models,
    run_models_async,
)
from dphil.core.episode import replay
from dphil.core.records import EpisodeConfig, check_episode
from tests.support.openai_server import OpenAIServer, Reply, status, text, tool

KEY = "sk-runner-test-0123456789"
FAST = Limits(concurrency=8, timeout=5, retries=2, backoff=0.01, backoff_max=0.02)


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("DPHIL_TEST_KEY", KEY)


def make_spec(server, name="m", **kw):
    return ModelSpec(name=name, model=f"openai/{name}", api_base=server.url, api_key_env="DPHIL_TEST_KEY", **kw)


def seat_of(body):
    return int(re.search(r"You are philosopher (\d+)", body["messages"][0]["content"]).group(1))


def last_user(body):
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


def play(server, n=3, rounds=3, schedule="simultaneous", settings=None, spec=None, seed=0, limits=FAST):
    spec = spec or make_spec(server)
    settings = settings or AgentSettings(builtin_prompt())
    config = EpisodeConfig(
        spec.name, n, rounds=rounds, seed=seed, schedule=schedule, variant=model_variant(spec, settings)
    )

    async def go():
        return await play_episode(config, spec, settings, Gateway(limits))

    return asyncio.run(go())


def test_simultaneous_episode_is_a_valid_replayable_record():
    with OpenAIServer() as server:
        record = play(server, n=4, rounds=4)
        again = play(server, n=4, rounds=4)
    check_episode(record)
    assert record["status"] == "complete"
    outcome = replay(record)
    assert list(outcome.meals) == record["meals"] and outcome.deadlock == record["deadlock"]
    turns = record["turns"]
    assert len(turns) == 4 * record["rounds_played"]
    for t in turns:
        assert t["action"] == t["tool_call"]["name"]
        assert t["parsed_via"] == "tool" and t["ignored_tool_calls"] == []
        assert t["usage"]["prompt_tokens"] > 0 and t["latency_s"] >= 0 and t["retries"] == 0
        assert t["cost"] == 0.0
    u = record["usage"]
    assert u["calls"] == len(turns)
    assert u["prompt_tokens"] == sum(t["usage"]["prompt_tokens"] for t in turns)
    assert u["completion_tokens"] == sum(t["usage"]["completion_tokens"] for t in turns)
    # Replies depend only on what each philosopher was told: same seed, same episode.
    assert [t["action"] for t in again["turns"]] == [t["action"] for t in turns]
    assert again["episode_id"] == record["episode_id"]
    for field in ("prompt", "prompt_version", "memory", "talk", "litellm_model", "tools"):
        assert field in record


def test_a_round_s_calls_go_out_together_under_simultaneous_one_at_a_time_under_sequential():
    with OpenAIServer() as server, ThreadPoolExecutor(1) as pool:
        server.hold_after(0)  # hold every call: they can only all arrive if sent together
        played = pool.submit(play, server, n=5, rounds=2)
        assert server.wait_arrived(5)
        assert server.in_flight == 5
        server.release()
        played.result(timeout=300)
        assert server.max_in_flight == 5
    with OpenAIServer(latency=0.02) as server:
        record = play(server, n=5, rounds=2, schedule="sequential")
        assert server.max_in_flight == 1
        seats = [seat_of(r["body"]) for r in server.requests]
        assert seats == [0, 1, 2, 3, 4] * record["rounds_played"]
    check_episode(record)
    replay(record)


def test_sequential_agents_see_the_table_as_left_by_the_previous_one():
    def policy(body):
        return tool("pick-up-left") if seat_of(body) == 1 else tool("think")

    with OpenAIServer(default=policy) as server:
        play(server, n=3, rounds=1, schedule="sequential")
        by_seat = {seat_of(r["body"]): last_user(r["body"]) for r in server.requests}
    # Philosopher 0's right fork is fork 1, just taken by philosopher 1 in the same round.
    assert "Your right fork (fork 1): free." in by_seat[0]
    assert "Your left fork (fork 2): free." in by_seat[2]
    assert "Your left fork (fork 1)" in by_seat[1]


def test_failed_call_ends_the_episode_with_error_never_a_null_action():
    calls = {"n": 0}

    def policy(body):
        calls["n"] += 1
        return status(500) if calls["n"] > 6 else tool("think")  # round 3 onwards fails

    with OpenAIServer(default=policy) as server:
        record = play(server, n=3, rounds=5)
    assert record["status"] == "error"
    assert "gave up after 3 attempt(s)" in record["error"] and "500" in record["error"]
    assert KEY not in record["error"]
    assert record["turns"] and all(t["action"] == "think" for t in record["turns"])
    assert {t["round"] for t in record["turns"]} == {1, 2}
    assert record["usage"]["calls"] == 6


def test_several_tool_calls_first_counts_rest_ignored_and_answered():
    with OpenAIServer(default=lambda body: tool("think", "eat", arguments="{oops")) as server:
        record = play(server, n=2, rounds=2)
        later = [r["body"] for r in server.requests if "Round 2" in last_user(r["body"])]
    first = record["turns"][0]
    assert first["action"] == "think"
    assert first["tool_call"] == {"name": "think", "arguments": "{oops"}
    assert first["ignored_tool_calls"] == [{"name": "eat", "arguments": "{oops"}]
    tool_msgs = [m for m in later[0]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["done", "ignored: only the first tool call of a round counts"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_0", "call_1"]


def test_text_mode_model_gets_no_tools_and_its_reasoning_is_stripped():
    reply = text("<think>ACTION: eat? no.</think>\nACTION: think", reasoning=None)
    with OpenAIServer(default=lambda body: reply) as server:
        record = play(server, n=2, rounds=2, spec=make_spec(server, "textual", tools=False))
        bodies = [r["body"] for r in server.requests]
    assert all("tools" not in b for b in bodies)
    assert "ACTION: <name>" in bodies[0]["messages"][0]["content"]
    t = record["turns"][0]
    assert (t["action"], t["parsed_via"], t["tool_call"]) == ("think", "action-line", None)
    # litellm moves a leading <think> block into reasoning_content; both are recorded.
    assert t["raw"].strip() == "ACTION: think"
    assert t["reasoning"] == "ACTION: eat? no."
    # The conversation keeps the answer without the reasoning.
    history = [m for m in bodies[-1]["messages"] if m["role"] == "assistant"]
    assert history[0]["content"] == "ACTION: think"


def test_unparseable_reply_is_a_null_action_with_the_raw_reply_kept():
    with OpenAIServer(default=lambda body: text("I would rather not say.")) as server:
        record = play(server, n=2, rounds=1)
    assert record["status"] == "complete"
    for t in record["turns"]:
        assert t["action"] is None and t["ok"] is False and t["reason"] == "no-action"
        assert t["raw"] == "I would rather not say."
    replay(record)


@pytest.mark.parametrize(("memory", "expected"), [("full", [2, 5, 8]), ("window:1", [2, 5, 5]), ("none", [2, 2, 2])])
def test_memory_controls_how_much_history_is_sent(memory, expected):
    with OpenAIServer(default=lambda body: tool("think")) as server:
        settings = AgentSettings(builtin_prompt(), memory=memory)
        play(server, n=2, rounds=3, settings=settings)
        sizes = [len(r["body"]["messages"]) for r in server.requests if seat_of(r["body"]) == 0]
    # system + (user, assistant, tool) per remembered round + this round's user message
    assert sizes == expected


def test_talk_messages_arrive_in_written_order_and_never_stale():
    def policy(body):
        seat = seat_of(body)
        ask = last_user(body)
        m = re.search(r"message (\d) of 2", ask)
        if m:
            rnd = re.search(
                r"Round (\d)", " ".join(x["content"] or "" for x in body["messages"] if x["role"] == "user")
            ).group(1)
            rounds_seen = len([x for x in body["messages"] if x["role"] == "user" and x["content"].startswith("Round")])
            return text(f"p{seat} r{rounds_seen} m{m.group(1)} {rnd}")
        return tool("think")

    settings = AgentSettings(builtin_prompt(), talk=2, memory="none")
    with OpenAIServer(default=policy) as server:
        record = play(server, n=3, rounds=2, settings=settings)
        bodies = [r["body"] for r in server.requests]
    action_asks = [last_user(b) for b in bodies if seat_of(b) == 1 and "Choose your action" in last_user(b)]
    assert len(action_asks) == 2
    # Round 2's action prompt: only round 2's messages, step 2 after step 1 for each sender.
    lines = [x for x in action_asks[1].splitlines() if x.startswith("- philosopher")]
    assert lines == [
        '- philosopher 0 (left neighbour): "p0 r1 m2 2"',
        '- philosopher 2 (right neighbour): "p2 r1 m2 2"',
    ]
    step2 = [last_user(b) for b in bodies if seat_of(b) == 1 and "message 2 of 2" in last_user(b)]
    assert '"p0 r1 m1 1"' in step2[0] and '"p2 r1 m1 1"' in step2[0]
    step1 = [last_user(b) for b in bodies if seat_of(b) == 1 and "message 1 of 2" in last_user(b)]
    assert "- philosopher" not in step1[0]  # nobody has written yet this round
    t = record["turns"][0]
    assert [m["text"] for m in t["talk"]] == ["p0 r1 m1 1", "p0 r1 m2 1"]
    assert record["usage"]["calls"] == 3 * 2 * 3  # (2 talk + 1 action) x 3 seats x 2 rounds


def test_sequential_talk_lets_later_seats_read_earlier_messages_of_the_same_step():
    def policy(body):
        if "message 1 of 1" in last_user(body):
            return text(f"hello from {seat_of(body)}")
        return tool("think")

    settings = AgentSettings(builtin_prompt(), talk=1)
    with OpenAIServer(default=policy) as server:
        play(server, n=3, rounds=1, schedule="sequential", settings=settings)
        talks = {
            seat_of(r["body"]): last_user(r["body"])
            for r in server.requests
            if "message 1 of 1" in last_user(r["body"])
        }
    assert "hello from" not in talks[0]
    assert '"hello from 0"' in talks[1]
    assert '"hello from 0"' in talks[2] and '"hello from 1"' in talks[2]


def grid(spec, settings, count, n=2, rounds=2):
    variant = model_variant(spec, settings)
    return [EpisodeConfig(spec.name, n, rounds=rounds, seed=k, variant=variant) for k in range(count)]


def test_run_bounds_concurrency_across_episodes_and_skips_done():
    settings = AgentSettings(builtin_prompt())
    with OpenAIServer() as server, ThreadPoolExecutor(1) as pool:
        spec = make_spec(server)
        configs = grid(spec, settings, 8)
        done = {configs[0].episode_id, configs[5].episode_id}
        out: list[dict] = []
        server.hold_after(0)  # three calls held at once fill --concurrency 3; no fourth comes
        running = pool.submit(
            run_models,
            configs,
            {spec.name: spec},
            settings,
            out.append,
            limits=Limits(concurrency=3, timeout=30),
            done=done,
        )
        assert server.wait_arrived(3)
        assert not server.wait_arrived(4, timeout=0.5)  # not a timing: nothing may come at all
        server.release()
        stats = running.result(timeout=300)
        assert server.max_in_flight == 3
    assert stats.written == 6 and stats.skipped_done == 2 and stats.errors == 0
    assert {r["episode_id"] for r in out} == {c.episode_id for c in configs} - done
    assert stats.usage.calls == sum(r["usage"]["calls"] for r in out)


def test_max_errors_stops_a_failing_run():
    settings = AgentSettings(builtin_prompt())
    with OpenAIServer(default=lambda body: status(503)) as server:
        spec = make_spec(server)
        out: list[dict] = []
        with pytest.raises(TooManyErrors, match="--max-errors 2"):
            run_models(
                grid(spec, settings, 20),
                {spec.name: spec},
                settings,
                out.append,
                limits=Limits(concurrency=1, retries=0, backoff=0.01),
                max_errors=2,
            )
    assert len(out) == 2 and all(r["status"] == "error" for r in out)


def test_cost_limit_stops_starting_new_episodes():
    settings = AgentSettings(builtin_prompt())
    priced = Reply(tools=(("think", "{}"),), usage=(100_000, 0))  # $0.015 per call at 4o-mini
    with OpenAIServer(default=lambda body: priced) as server:
        spec = ModelSpec(
            name="gpt-4o-mini", model="openai/gpt-4o-mini", api_base=server.url, api_key_env="DPHIL_TEST_KEY"
        )
        out: list[dict] = []

        async def go():
            return await run_models_async(
                grid(spec, settings, 10, n=2, rounds=1),
                {spec.name: spec},
                settings,
                out.append,
                gateway=Gateway(Limits(concurrency=1)),
                cost_limit=0.05,
            )

        stats = asyncio.run(go())
    # Each episode costs 2 x $0.015 = $0.03: the second one crosses $0.05, then none start.
    assert stats.written == 2 and stats.not_started == 8
    assert out[0]["usage"]["cost"] == pytest.approx(0.03)
    assert stats.usage.cost == pytest.approx(0.06)
