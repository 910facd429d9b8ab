"""One philosopher played by a language model: its own conversation and how much it remembers.

The conversation is kept as one block of messages per round (the talk steps,
the observation, the reply, and the tool results that say how the action
turned out), so `--memory window:K` can drop whole rounds and never leaves a
tool call without its result, which providers reject.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dphil.agents.parsing import Parsed, parse_reply, strip_reasoning
from dphil.agents.prompts import REASON_TEXT, Prompt
from dphil.io.errors import UsageError

_WINDOW = re.compile(r"window:(\d+)")
MAX_MESSAGE_CHARS = 400


def parse_memory(text: str) -> str:
    """Check a `--memory` value: `full`, `none` or `window:K` (K >= 1 rounds)."""
    if text in ("full", "none"):
        return text
    m = _WINDOW.fullmatch(text)
    if m and int(m.group(1)) >= 1:
        return f"window:{int(m.group(1))}"
    raise UsageError(f"--memory: expected full, none or window:K with K >= 1, got {text!r}")


@dataclass(frozen=True)
class AgentSettings:
    """How every agent of a run is set up; `variant()` goes into the episode id."""

    prompt: Prompt
    memory: str = "full"
    talk: int = 0

    def __post_init__(self) -> None:
        parse_memory(self.memory)
        if self.talk < 0:
            raise UsageError("--talk: must be 0 or more")

    def variant(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt.name,
            "prompt_version": self.prompt.version,
            "memory": self.memory,
            "talk": self.talk,
        }


class Agent:
    """A philosopher's side of the conversation with the model."""

    def __init__(
        self, philosopher: int, system: str, protocol: str, *, memory: str = "full", tools: bool = True
    ) -> None:
        self.philosopher = philosopher
        self.protocol = protocol
        self.tools = tools
        self.system = {"role": "system", "content": system}
        memory = parse_memory(memory)
        self.window: int | None = None if memory == "full" else 0 if memory == "none" else int(memory.split(":")[1])
        self.past: list[list[dict[str, Any]]] = []
        self.current: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []  # tool calls of this round awaiting results

    def messages(self) -> list[dict[str, Any]]:
        """What the model reads for its next reply: system, remembered rounds, this round."""
        past = self.past if self.window is None else self.past[len(self.past) - self.window :]
        if self.window == 0:
            past = []
        out = [self.system]
        for block in past:
            out.extend(block)
        out.extend(self.current)
        return out

    def ask(self, text: str) -> list[dict[str, Any]]:
        """Add a user message to this round and return the conversation to send."""
        self.current.append({"role": "user", "content": text})
        return self.messages()

    def heard(self, content: str | None) -> str:
        """Record a talk reply (reasoning and tool calls dropped) and return the message text."""
        message = strip_reasoning(content or "")[:MAX_MESSAGE_CHARS].strip()
        self.current.append({"role": "assistant", "content": message})
        return message

    def answered(self, content: str | None, tool_calls: list[dict[str, Any]]) -> Parsed:
        """Record the action reply and parse it into an action."""
        parsed = parse_reply(content, tool_calls, self.protocol)
        text = strip_reasoning(content) if content else None
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if tool_calls:
            reply["tool_calls"] = tool_calls
            self._pending = tool_calls
        elif not text:
            reply["content"] = ""
        self.current.append(reply)
        return parsed

    def outcome(self, turn: dict[str, Any]) -> None:
        """Close the round: answer its tool calls with what happened, and file it in memory."""
        for k, call in enumerate(self._pending):
            if k > 0:
                result = "ignored: only the first tool call of a round counts"
            elif turn["ok"]:
                result = "done"
            elif turn["action"] is None:
                result = f"failed: {call['function']['name']!r} is not one of your actions"
            else:
                result = "failed: " + REASON_TEXT.get(turn["reason"], str(turn["reason"]))
            self.current.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        self._pending = []
        self.past.append(self.current)
        self.current = []
        if self.window is not None and len(self.past) > self.window:
            del self.past[: len(self.past) - self.window]
