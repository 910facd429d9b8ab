"""From a model's reply to one protocol action, or to None with the reply kept.

Order of trust: a function call, then text: a `<tool_call>…</tool_call>` block
written as text, then an `ACTION: name` line, then a JSON object naming the
action (`{"name": ACTION, "arguments": {…}}` or `{"action": …}`; one left
unclosed at the end of the reply is read when unambiguous), then a reply that
is nothing but an action name. One rule on every path: when a reply holds
several calls, lines or objects, the FIRST that names an action counts and the
rest are kept as ignored (`{"name", "arguments"}` each). Reasoning
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
    received (reasoning included); `via` how the action was found: `tool`
    (a parsed function call), `tool-call-text` (a `<tool_call>` block in the
    text), `action-line`, `json-call` (`{"name": ACTION, "arguments": …}` in
    the text), `json` (another object naming the action), `json-unclosed`
    (an object cut off before its closing brace(s)), `bare` or None.
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
    action, call, ignored, via = _from_text(body, protocol)
    return Parsed(action, call, ignored, text, via)


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


_TextRead = tuple[str | None, dict[str, Any] | None, list[dict[str, Any]], str | None]
_TOOL_CALL_TEXT = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", _FLAGS)


def _from_text(body: str, protocol: str) -> _TextRead:
    blocks = [b for b in (_call_in_text(m.group(1)) for m in _TOOL_CALL_TEXT.finditer(body)) if b]
    if blocks:
        # Like a parsed call: the first block counts, even if its name is no action.
        return _action_of_call(blocks[0], protocol), blocks[0], blocks[1:], "tool-call-text"
    lines = []
    for m in _ACTION_LINE.finditer(body):
        end = body.find("\n", m.end())
        action = _leading_action(body[m.end() : end if end != -1 else len(body)], protocol)
        if action:
            lines.append(action)
    if lines:
        return lines[0], None, [{"name": a, "arguments": {}} for a in lines[1:]], "action-line"
    named = []
    for obj, closed in _json_objects(body, with_unclosed=True):
        read = _action_of_object(obj, protocol)
        if read is None or (not closed and read[1] != "json-call"):
            continue  # an unclosed object counts only as an unambiguous call
        action, via = read
        named.append((action, obj, via if closed else "json-unclosed"))
    if named:
        action, obj, via = named[0]
        call = _as_call(obj) if via != "json" else None
        return action, call, [{"name": a, "arguments": _as_call(o)["arguments"]} for a, o, _ in named[1:]], via
    action = normalise_action(body, protocol)
    if action:
        return action, None, [], "bare"
    return None, None, [], None


def _as_call(obj: dict[str, Any]) -> dict[str, Any]:
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"name": obj.get("name"), "arguments": args if args is not None else {}}


def _action_of_object(obj: dict[str, Any], protocol: str) -> tuple[str, str] | None:
    """The action a JSON object names, and `json-call` when it has the tool-call shape."""
    if "name" in obj and ("arguments" in obj or "parameters" in obj):
        action = normalise_action(obj["name"], protocol)
        if action:
            return action, "json-call"
    for k in _JSON_KEYS:
        action = normalise_action(obj.get(k), protocol)
        if action:
            return action, "json"
    return None


def _call_in_text(inner: str) -> dict[str, Any] | None:
    """The `{"name", "arguments"}` call a `<tool_call>` block holds (closed or cut off), else None."""
    for obj, _ in _json_objects(inner, with_unclosed=True):
        if "name" in obj:
            call = _as_call(obj)
            if isinstance(call["arguments"], str):
                with contextlib.suppress(ValueError):
                    call["arguments"] = json.loads(call["arguments"]) if call["arguments"].strip() else {}
            return call
    return None


def _leading_action(rest: str, protocol: str) -> str | None:
    """The action named by the first one to three words of `rest` (`eat now` -> eat)."""
    words = rest.split()
    for k in range(1, min(3, len(words)) + 1):
        action = normalise_action(" ".join(words[:k]), protocol)
        if action:
            return action
    return None


def _json_objects(text: str, *, with_unclosed: bool = False) -> list[tuple[dict[str, Any], bool]]:
    """Every JSON object embedded in `text` (fenced or not), outermost first, each with
    whether it was closed; with `with_unclosed`, also the one object the text ends
    inside, when adding its missing closing brace(s) makes it valid JSON."""
    found: list[tuple[dict[str, Any], bool]] = []
    decoder = json.JSONDecoder()
    pos = text.find("{")
    while pos != -1:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except ValueError:
            if with_unclosed:
                closed = _close(text[pos:])
                if closed is not None:
                    found.append((closed, False))
                    break
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict):
            found.append((obj, True))
        pos = text.find("{", end)
    return found


def _close(tail: str) -> dict[str, Any] | None:
    """`tail` (starting at `{`) as an object if it lacks only closing braces at its end."""
    depth, in_string, escaped = 0, False, False
    for ch in tail:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return None  # the object closed (and was not valid JSON): not a cut-off
    if in_string or depth <= 0 or "[" in tail:
        return None
    try:
        obj = json.loads(tail.rstrip() + "}" * depth)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
