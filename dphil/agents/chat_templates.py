"""Chat templates for base models that ship none (Gemma 3 270M base, for one).

A tokenizer without a chat template cannot turn dphil's conversations into a
prompt ("tokenizer.chat_template is not set"). The templates live as data in
`chat_templates.toml`, one per model family; the tokenizer's own template
always wins when it has one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    families: tuple[str, ...]
    template: str
    stop: tuple[str, ...]


@cache
def templates() -> tuple[ChatTemplate, ...]:
    data = tomllib.loads(files("dphil.agents").joinpath("chat_templates.toml").read_text("utf-8"))
    return tuple(
        ChatTemplate(name, tuple(t["families"]), t["template"], tuple(t.get("stop", ()))) for name, t in data.items()
    )


def for_family(model_type: str | None) -> ChatTemplate | None:
    """The template for a `config.model_type`, or None when dphil knows none."""
    for t in templates():
        if model_type in t.families:
            return t
    return None


def ensure_chat_template(tokenizer: Any, model_type: str | None) -> ChatTemplate | None:
    """Give `tokenizer` the family's template when it has none; return the template used, if ours."""
    if getattr(tokenizer, "chat_template", None):
        return None
    t = for_family(model_type)
    if t is not None:
        tokenizer.chat_template = t.template
    return t
