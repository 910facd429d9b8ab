"""The protocol's actions as OpenAI function-calling tools.

One tool per action, named exactly as the action, so a tool call's name *is*
the action and nothing has to be mapped back. The tools take no arguments:
the whole decision is which tool to call, and the schemas say so
(`additionalProperties: false`). Kept free of litellm so that the
local-model trainer can reuse it.
"""

from __future__ import annotations

from typing import Any

from dphil.core.protocols import PROTOCOLS, protocol_actions

# What each action does, in words the model reads as the tool's description.
ACTION_DESCRIPTIONS: dict[str, dict[str, str]] = {
    "paper": {
        "pick-up-left": "Pick up your left fork. Fails if someone already holds it.",
        "pick-up-right": "Pick up your right fork. Fails if someone already holds it.",
        "put-down-left": "Put down your left fork so your left neighbour can use it.",
        "put-down-right": "Put down your right fork so your right neighbour can use it.",
        "eat": "Eat one meal. Works only while you hold both of your forks; you keep holding them afterwards.",
        "think": "Do nothing this round.",
    },
    "dpbench": {
        "grab-left": "Grab your left fork. Fails if someone already holds it.",
        "grab-right": "Grab your right fork. Fails if someone already holds it.",
        "release": "Put down every fork you hold.",
        "wait": "Do nothing this round.",
    },
}


def action_description(protocol: str, action: str) -> str:
    """The one-line description of an action, as the tool and the prompt state it."""
    return ACTION_DESCRIPTIONS[protocol][action]


def tool_specs(protocol: str) -> list[dict[str, Any]]:
    """The protocol's actions as a list of OpenAI `tools` entries (type `function`)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}")
    return [
        {
            "type": "function",
            "function": {
                "name": action,
                "description": action_description(protocol, action),
                # No arguments, and none may be invented: a grammar-constrained call
                # (tool_choice=required) is then a dozen tokens, not arguments to the cap.
                "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
            },
        }
        for action in protocol_actions(protocol)
    ]
