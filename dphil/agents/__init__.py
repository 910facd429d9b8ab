"""Language-model philosophers through litellm: prompts, tools, reply parsing, the model
registry, calls, agents and the async episode runner.

`prompts`, `tools` and `parsing` never import litellm, so the in-process models (`dphil.local`)
reuse them; `llm` imports litellm on the first model call only.
"""

from dphil._face import lazy_face

_EXPORTS = {
    "registry": (
        "Registry",
        "ModelSpec",
    ),
    "prompts": (
        "Prompt",
        "get_prompt",
        "system_prompt",
        "observation_text",
        "BUILTIN_TEMPLATES",
    ),
    "tools": ("tool_specs",),
    "parsing": (
        "parse_reply",
        "Parsed",
    ),
    "agent": (
        "Agent",
        "AgentSettings",
    ),
    "llm": (
        "Gateway",
        "LLMCallError",
    ),
    "redaction": ("redact",),
    "runner": (
        "run_models",
        "plan_models",
        "play_episode",
    ),
    "router": ("make_router",),
    "chat_templates": ("ensure_chat_template",),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
