"""The ART backend's data path with ART's real types (importable without a GPU).

`import art` patches transformers for the whole process, so the checks that
need ART's types run in a child Python; this process never imports it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from click.testing import CliRunner

if importlib.util.find_spec("art") is None:
    pytest.skip("openpipe-art is not installed", allow_module_level=True)

CHILD_PREAMBLE = """
import json
from dphil.agents.tools import tool_specs
from dphil.core.records import EpisodeConfig
from dphil.train.art_backend import choice_message, episode_trajectories, import_art, scenario_group
"""


CHILD_BODY = """
def make_choice(action: str, *, tool: bool):
    from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
    from openai.types.chat.chat_completion_message import ChatCompletionMessage
    from openai.types.chat.chat_completion_message_tool_call import (
        ChatCompletionMessageToolCall,
        Function,
    )
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

    calls = [
        ChatCompletionMessageToolCall(
            id=f"call_{action}", type="function", function=Function(name=action, arguments="{}")
        )
    ]
    message = ChatCompletionMessage(
        role="assistant",
        content=None if tool else f"ACTION: {action}",
        tool_calls=calls if tool else None,
    )
    logprobs = ChoiceLogprobs(
        content=[
            ChatCompletionTokenLogprob(token=action, logprob=-0.5, bytes=None, top_logprobs=[])
        ]
    )
    return Choice(
        index=0, finish_reason="tool_calls" if tool else "stop", message=message, logprobs=logprobs
    )


def check():
    art = import_art("art-serverless")  # serverless needs nothing beyond ART itself
    cfg = EpisodeConfig(model="art:Qwen/Qwen3-14B", n=2, rounds=1, seed=3)
    histories = [
        [
            {"role": "system", "content": "seat 0"},
            {"role": "user", "content": "round 1"},
            make_choice("pick-up-left", tool=True),
        ],
        [
            {"role": "system", "content": "seat 1"},
            {"role": "user", "content": "round 1"},
            make_choice("think", tool=False),
        ],
    ]
    tools = tool_specs("paper")
    trajectories = episode_trajectories(art, cfg, histories, 0.75, tools)
    assert len(trajectories) == 2
    for i, t in enumerate(trajectories):
        assert isinstance(t, art.Trajectory)
        assert t.reward == 0.75 and t.metadata["philosopher"] == i
        assert t.metadata["episode_id"] == cfg.episode_id
        # The Choice object itself is kept (ART trains only on Choices with logprobs).
        last = t.messages_and_choices[-1]
        assert type(last).__name__ == "Choice" and last.logprobs is not None
    other = episode_trajectories(art, cfg, histories, 0.25, tools)
    group = scenario_group(art, [trajectories, other], "3")
    assert isinstance(group, art.TrajectoryGroup)
    assert len(group.trajectories) == 4
    assert sorted({t.reward for t in group.trajectories}) == [0.25, 0.75]
    # What is sent back to the API for a past Choice is a plain assistant message.
    msg = choice_message(histories[0][-1])
    assert msg["role"] == "assistant"
    assert msg["tool_calls"][0]["function"]["name"] == "pick-up-left"
    json.dumps(msg)
"""
CHILD = CHILD_PREAMBLE + CHILD_BODY + "\ncheck()\nprint('ok')\n"


def test_one_trajectory_per_philosopher_and_one_group_per_scenario():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="the GPU stack is here")
def test_art_without_its_gpu_stack_says_what_to_install(tmp_path):
    from dphil.commands.train import main

    result = CliRunner().invoke(
        main,
        [
            "--backend",
            "art",
            "--base-model",
            "Qwen/Qwen3-0.6B",
            "--run-dir",
            str(tmp_path / "r"),
            "--steps",
            "1",
        ],
    )
    assert result.exit_code == 69
    assert "pip install" in result.stderr and "vllm" in result.stderr


def test_hosted_trainers_need_their_credentials(tmp_path, monkeypatch):
    from dphil.commands.train import main

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    result = CliRunner().invoke(
        main,
        [
            "--backend",
            "art-serverless",
            "--base-model",
            "Qwen/Qwen3-8B",
            "--run-dir",
            str(tmp_path / "r"),
            "--steps",
            "1",
        ],
    )
    assert result.exit_code == 78
    assert "WANDB_API_KEY" in result.stderr
