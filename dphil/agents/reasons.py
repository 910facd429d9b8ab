"""Why a model call failed, in the server's own words.

litellm's exception text often drops what the server said: through the `openai/` provider
a 400 from `transformers serve` reads only `BadRequestError ... Error code: 400`, while its
body said `{"detail": "Server is pinned to '/models/x'; requested 'x'"}`. The body is still
there, on the openai exception litellm chained its own to, or quoted in litellm's message
(`hosted_vllm/`); `server_message` finds it in either place, for 4xx and 5xx alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_SERVER_MESSAGE = 300


def server_message(error: BaseException) -> str | None:
    """The message in the failed reply's body (`detail`, `error.message`, `message`), if any."""
    for link in _chain(error):
        found = _from_body(getattr(link, "body", None))
        if found:
            return found
        found = _from_text(getattr(getattr(link, "response", None), "text", None))
        if found:
            return found
    for link in _chain(error):
        found = _embedded(str(link))
        if found:
            return found
    return None


def http_status(error: BaseException) -> int | None:
    for link in _chain(error):
        status = getattr(link, "status_code", None)
        if not isinstance(status, int):
            status = getattr(getattr(link, "response", None), "status_code", None)
        if isinstance(status, int) and status >= 400:
            return status
    return None


def describe(error: BaseException) -> str:
    """One line: the exception type, the HTTP status and the server's message when there is one,
    else the first line of the exception's text."""
    name = type(error).__name__
    said = server_message(error)
    if said:
        status = http_status(error)
        return f"{name} (HTTP {status}): {said}" if status else f"{name}: {said}"
    text = str(error).strip().splitlines()
    first = _SSL_REPR.sub("", next((line for line in text if line.strip()), ""))
    return f"{name}: {first}"[:500]


# aiohttp's connection errors quote the SSL context's repr ("ssl:<ssl.SSLContext object at 0x...>",
# "ssl:default"): an address in memory, noise in a message that should say what to do.
_SSL_REPR = re.compile(r"\s*ssl:(?:<[^>]*>|default|None|False)")


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in seen and len(seen) < 10:
        seen.append(link)
        link = link.__cause__ or link.__context__
    return seen


def _from_body(body: Any) -> str | None:
    if isinstance(body, str):
        return _from_text(body)
    if not isinstance(body, dict):
        return None
    for key in ("detail", "message", "error"):
        value = body.get(key)
        if isinstance(value, dict):
            value = value.get("message") or value.get("detail")
        if isinstance(value, list):  # FastAPI validation errors: a list of {msg, loc}
            value = "; ".join(str(v.get("msg", v)) if isinstance(v, dict) else str(v) for v in value)
        if isinstance(value, str) and value.strip():
            return _cut(value)
    return None


def _from_text(text: Any) -> str | None:
    if not isinstance(text, str) or not text.lstrip().startswith("{"):
        return None
    try:
        return _from_body(json.loads(text))
    except ValueError:
        return None


def _embedded(text: str) -> str | None:
    """A JSON object quoted inside an exception's message (`...Exception - {"detail": ...}`)."""
    start = text.find("{")
    while start != -1:
        try:
            body, _ = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            start = text.find("{", start + 1)
            continue
        return _from_body(body)
    return None


def _cut(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_SERVER_MESSAGE else flat[: MAX_SERVER_MESSAGE - 1] + "…"
