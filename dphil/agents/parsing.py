"""From a model's reply to one protocol action, or to None with the reply kept.

Order of trust: a function call (the first one counts; any further calls are
kept as ignored), then text: the last `ACTION: name` line, then a JSON object
naming the action, then a reply that is nothing but an action name. Reasoning
blocks (`<think>…</think>` and the like) are cut out before the text is read,
so a model thinking aloud about actions it rejects is not taken at its word.
An unparseable reply is `action: None`, never a guessed default. Free of
litellm so the local-model trainer can reuse it.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from dphil.core.protocols import protocol_actions

_REASONING_TAGS = ("think", "thinking", "reasoning", "reflection")
_TAGS = "|".join(_REASONING_TAGS)
_FLAGS = re.IGNORECASE | re.DOTALL
_CLOSED = re.compile(r"<(" + _TAGS + r")\b[^>]*>.*?</\1\s*>", _FLAGS)
_UNOPENED = re.compile(r"^.*</(?:" + _TAGS + r")\s*>", _FLAGS)
_UNCLOSED = re.compile(r"<(?:" + _TAGS + r")\b[^>]*>.*\Z", _FLAGS)
_ACTION_LINE = re.compile(r"\baction\s*[:=]", re.IGNORECASE)
_STRIP_CHARS = " \t\r\n`*_\"'.!:;,()[]<>"
# Keys a JSON reply may use for the action, in order of preference.
_JSON_KEYS = ("action", "tool", "name", "function", "choice")


@dataclass(frozen=True, slots=True)
class Parsed:
    """The action read from one reply, and what it was read from.

    `tool_call` is the call that counted (`{"name", "arguments"}`, the
    arguments decoded from JSON when they are valid JSON, else kept as the
    raw string); `ignored` the further calls; `raw` the reply text as
    received (reasoning included); `via` how the action was found: `tool`,
    `action-line`, `json`, `bare` or None.
    """

    action: str | None
    tool_call: dict[str, Any] | None = None
    ignored: list[dict[str, Any]] = field(default_factory=list)
    raw: str | None = None
    via: str | None = None


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def normalise_action(name: Any, protocol: str) -> str | None:
    """The protocol action `name` denotes, forgiving case, spacing, `_` and quotes; else None."""
    if not isinstance(name, str):
        return None
    wanted = _key(name.strip(_STRIP_CHARS))
    if not wanted:
        return None
    for action in protocol_actions(protocol):
        if _key(action) == wanted:
            return action
    return None


def strip_reasoning(text: str) -> str:
    """The reply without reasoning blocks: closed ones, a closing tag with no opening
    (its opening was part of the chat template), and a block cut off unclosed."""
    text = _CLOSED.sub("", text)
    text = _UNOPENED.sub("", text)
    text = _UNCLOSED.sub("", text)
    return text.strip()


def tool_call_dict(call: Any) -> dict[str, Any]:
    """One tool call, from an OpenAI/litellm object or dict, as `{"name", "arguments"}` (+ `id`)."""
    if isinstance(call, dict):
        fn = call.get("function") or {}
        cid = call.get("id")
        name = fn.get("name") if isinstance(fn, dict) else getattr(fn, "name", None)
        args = fn.get("arguments") if isinstance(fn, dict) else getattr(fn, "arguments", None)
    else:
        fn = getattr(call, "function", None)
        cid = getattr(call, "id", None)
        name = getattr(fn, "name", None)
        args = getattr(fn, "arguments", None)
    if isinstance(args, str):
        # Malformed arguments are recorded as the raw string, not repaired.
        with contextlib.suppress(ValueError):
            args = json.loads(args) if args.strip() else {}
    out: dict[str, Any] = {"name": name, "arguments": args}
    if cid is not None:
        out["id"] = cid
    return out


def parse_reply(text: str | None, tool_calls: list[Any] | None, protocol: str) -> Parsed:
    """Read one action from a reply's text and/or tool calls."""
    calls = [tool_call_dict(c) for c in tool_calls or []]
    if calls:
        first, rest = calls[0], calls[1:]
        return Parsed(_action_of_call(first, protocol), first, rest, text, "tool")
    if not text:
        return Parsed(None, None, [], text, None)
    body = strip_reasoning(text)
    action, via = _from_text(body, protocol)
    return Parsed(action, None, [], text, via)


def _action_of_call(call: dict[str, Any], protocol: str) -> str | None:
    action = normalise_action(call.get("name"), protocol)
    if action is None and isinstance(call.get("arguments"), dict):
        # A single generic tool such as act({"action": "eat"}).
        args = call["arguments"]
        for k in _JSON_KEYS:
            action = normalise_action(args.get(k), protocol)
            if action:
                break
    return action


def _from_text(body: str, protocol: str) -> tuple[str | None, str | None]:
    for m in reversed(list(_ACTION_LINE.finditer(body))):
        end = body.find("\n", m.end())
        action = _leading_action(body[m.end() : end if end != -1 else len(body)], protocol)
        if action:
            return action, "action-line"
    for obj in reversed(_json_objects(body)):
        for k in _JSON_KEYS:
            action = normalise_action(obj.get(k), protocol)
            if action:
                return action, "json"
    action = normalise_action(body, protocol)
    if action:
        return action, "bare"
    return None, None


def _leading_action(rest: str, protocol: str) -> str | None:
    """The action named by the first one to three words of `rest` (`eat now` -> eat)."""
    words = rest.split()
    for k in range(1, min(3, len(words)) + 1):
        action = normalise_action(" ".join(words[:k]), protocol)
        if action:
            return action
    return None


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object embedded in `text` (fenced or not), outermost first."""
    found: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict):
            found.append(obj)
        pos = text.find("{", end)
    return found
