"""Chat templates for base models that ship none (Gemma 3 270M base, for one).

A tokenizer without a chat template cannot turn dphil's conversations into a
prompt ("tokenizer.chat_template is not set"). The templates live as data in
`chat_templates.toml`, one per model family; the tokenizer's own template
always wins when it has one.

A template is untrusted data (a model directory's own, or ours): transformers
renders it in Jinja's sandbox, and a template the sandbox refuses (one reaching
for Python's internals) or that cannot render is exit 65, one line naming the
model: checked once when the model loads, and on every render after.
"""

from __future__ import annotations

import contextlib
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from dphil.io.errors import DataError

# A conversation shaped like the ones dphil sends (system prompt, observation, reply,
# observation), rendered once when a model loads.
_PROBE = (
    {"role": "system", "content": "You are philosopher 0 at a table of 3."},
    {"role": "user", "content": "Round 1. Your forks are free."},
    {"role": "assistant", "content": "ACTION: think"},
    {"role": "user", "content": "Round 2. Your forks are free."},
)


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


def check_chat_template(tokenizer: Any, where: str) -> None:
    """Render the tokenizer's chat template once on a conversation like dphil's: a template
    the sandbox refuses, or one that cannot render, is a DataError (exit 65) naming `where`."""
    if not getattr(tokenizer, "chat_template", None):
        return
    with template_errors(where):
        tokenizer.apply_chat_template(
            [dict(m) for m in _PROBE], tokenize=False, add_generation_prompt=True, enable_thinking=False
        )


@contextlib.contextmanager
def template_errors(where: str) -> Iterator[None]:
    """Jinja's errors while rendering a chat template (SecurityError from the sandbox, a
    syntax error, the template's own raise_exception) as one DataError line naming `where`."""
    try:
        yield
    except Exception as e:
        import jinja2.exceptions

        if not isinstance(e, jinja2.exceptions.TemplateError):
            raise
        what = "refused by the sandbox" if isinstance(e, jinja2.exceptions.SecurityError) else "cannot be rendered"
        lines = str(e).strip().splitlines()
        detail = lines[0][:300] if lines else type(e).__name__
        raise DataError(f"{where}: chat template {what}: {type(e).__name__}: {detail}") from None
