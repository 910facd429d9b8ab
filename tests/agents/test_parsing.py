"""Reply -> action: tool calls, text fallbacks, reasoning blocks, failures kept raw."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dphil.agents.parsing import normalise_action, parse_reply, strip_reasoning
from dphil.core.protocols import protocol_actions


def call(name, arguments="{}", cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if cid:
        c["id"] = cid
    return c


def test_first_tool_call_counts_and_the_rest_are_kept_as_ignored():
    p = parse_reply("", [call("eat", cid="a"), call("think"), call("pick-up-left")], "paper")
    assert p.action == "eat"
    assert p.via == "tool"
    assert p.tool_call == {"name": "eat", "arguments": {}, "id": "a"}
    assert [c["name"] for c in p.ignored] == ["think", "pick-up-left"]


def test_malformed_arguments_are_recorded_raw_and_do_not_change_the_action():
    p = parse_reply(None, [call("put-down-right", "{not json")], "paper")
    assert p.action == "put-down-right"
    assert p.tool_call["arguments"] == "{not json"


def test_tool_call_with_unknown_name_is_no_action_even_if_text_names_one():
    p = parse_reply("ACTION: eat", [call("dance")], "paper")
    assert p.action is None
    assert p.tool_call["name"] == "dance"
    assert p.raw == "ACTION: eat"


def test_generic_tool_with_action_argument():
    p = parse_reply(None, [call("act", '{"action": "grab_right"}')], "dpbench")
    assert p.action == "grab-right"


@pytest.mark.parametrize(
    ("text", "protocol", "action", "via"),
    [
        ("ACTION: pick-up-left", "paper", "pick-up-left", "action-line"),
        ("I think so.\nAction: Pick Up Right.", "paper", "pick-up-right", "action-line"),
        ("**ACTION:** `think` for now", "paper", "think", "action-line"),
        # The FIRST line naming an action counts (it was the last before the rule was
        # made one for every path: tool calls always played the first).
        ("action = release\nACTION: wait", "dpbench", "release", "action-line"),
        ('```json\n{"action": "grab-left"}\n```', "dpbench", "grab-left", "json"),
        ('Sure: {"name": "eat", "why": "both forks"}', "paper", "eat", "json"),
        ("eat", "paper", "eat", "bare"),
        ("  `PUT_DOWN_LEFT`. ", "paper", "put-down-left", "bare"),
    ],
)
def test_text_fallbacks(text, protocol, action, via):
    p = parse_reply(text, None, protocol)
    assert (p.action, p.via) == (action, via)
    assert p.raw == text
    assert p.tool_call is None


def test_reasoning_is_stripped_before_parsing():
    text = "<think>ACTION: eat would fail, I hold one fork</think>\nACTION: pick-up-right"
    assert parse_reply(text, None, "paper").action == "pick-up-right"
    # A model whose chat template opened the block prints only the closing tag.
    assert parse_reply("I could eat... </think> think", None, "paper").action == "think"
    # A block cut off by the token limit hides everything after it.
    assert parse_reply("<think>maybe ACTION: eat", None, "paper").action is None
    assert strip_reasoning("a<reasoning>x</reasoning>b<THINKING>y</THINKING>c") == "abc"


@pytest.mark.parametrize(
    "text",
    ["", "I am not sure.", "ACTION: fly", "pick up the left one please", '{"action": 3}', None],
)
def test_unparseable_is_none_with_raw_kept(text):
    p = parse_reply(text, None, "paper")
    assert p.action is None
    assert p.raw == text
    assert p.via is None


def test_actions_of_the_other_protocol_are_not_accepted():
    assert parse_reply("ACTION: grab-left", None, "paper").action is None
    assert parse_reply("eat", None, "dpbench").action is None


@given(st.sampled_from(["paper", "dpbench"]), st.data())
def test_every_action_round_trips_in_every_format(protocol, data):
    action = data.draw(st.sampled_from(protocol_actions(protocol)))
    assert normalise_action(action.upper().replace("-", "_"), protocol) == action
    for text in (f"ACTION: {action}", f'{{"action": "{action}"}}', action, f"<think>ACTION: nothing</think>{action}"):
        assert parse_reply(text, None, protocol).action == action
    assert parse_reply(None, [call(action)], protocol).action == action


@given(st.text(max_size=200))
def test_parse_never_raises_and_returns_a_protocol_action_or_none(text):
    p = parse_reply(text, None, "paper")
    assert p.action is None or p.action in protocol_actions("paper")


def test_first_action_line_counts_and_the_rest_are_ignored():
    p = parse_reply("ACTION: nothing\nACTION: eat\nAction: think\nACTION: eat", None, "paper")
    assert (p.action, p.via) == ("eat", "action-line")
    assert p.ignored == [{"name": "think", "arguments": {}}, {"name": "eat", "arguments": {}}]


def test_first_json_object_counts_like_the_first_tool_call():
    text = '{"name": "pick-up-left", "arguments": {}}\n{"name": "eat", "arguments": {"x": 1}}'
    p = parse_reply(text, None, "paper")
    assert (p.action, p.via) == ("pick-up-left", "json-call")
    assert p.tool_call == {"name": "pick-up-left", "arguments": {}}
    assert p.ignored == [{"name": "eat", "arguments": {"x": 1}}]
    # Objects naming no action are passed over, not counted.
    p = parse_reply('{"note": 1} then {"action": "think"} {"action": "eat"}', None, "paper")
    assert (p.action, p.via, p.tool_call) == ("think", "json", None)
    assert [c["name"] for c in p.ignored] == ["eat"]


def test_tool_call_written_as_text():
    text = '<tool_call>\n{"name": "grab-left", "arguments": {}}\n</tool_call><tool_call>{"name": "wait"}</tool_call>'
    p = parse_reply(text, None, "dpbench")
    assert (p.action, p.via) == ("grab-left", "tool-call-text")
    assert p.tool_call == {"name": "grab-left", "arguments": {}}
    assert p.ignored == [{"name": "wait", "arguments": {}}]
    # A block cut off by the token cap, and one naming no action (no guessing from the text).
    assert parse_reply('<tool_call>{"name": "release", "arguments": {', None, "dpbench").action == "release"
    p = parse_reply('<tool_call>{"name": "dance"}</tool_call> ACTION: wait', None, "dpbench")
    assert (p.action, p.via) == (None, "tool-call-text")


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ('{"name": "pick-up-left", "arguments": {}', "pick-up-left"),
        ('I pick: {"name": "eat", "arguments": {"why": "both } forks"', "eat"),
        ('{"name": "eat", "arguments": {', "eat"),
        # Not unambiguous: no call shape, no action name, or closed but invalid.
        ('{"action": "eat"', None),
        ('{"name": "fly", "arguments": {}', None),
        ('{"name": "eat", "arguments": {}}}', "eat"),
        ('{"name": "eat" "arguments": {}}', None),
    ],
)
def test_json_missing_its_closing_braces(text, action):
    p = parse_reply(text, None, "paper")
    assert p.action == action
    if action is not None and text.count("{") > text.count("}"):
        assert p.via == "json-unclosed"


@given(st.sampled_from(["paper", "dpbench"]), st.data())
def test_the_first_of_several_counts_on_every_text_path(protocol, data):
    actions = data.draw(st.lists(st.sampled_from(protocol_actions(protocol)), min_size=1, max_size=4))
    forms = {
        "action-line": "\n".join(f"ACTION: {a}" for a in actions),
        "json-call": " ".join(f'{{"name": "{a}", "arguments": {{}}}}' for a in actions),
        "json": " ".join(f'{{"action": "{a}"}}' for a in actions),
        "tool-call-text": "".join(f'<tool_call>{{"name": "{a}", "arguments": {{}}}}</tool_call>' for a in actions),
    }
    for via, text in forms.items():
        p = parse_reply(text, None, protocol)
        assert (p.action, p.via) == (actions[0], via)
        assert [c["name"] for c in p.ignored] == actions[1:]
