"""Keeping secrets out of what is printed: API keys and anything shaped like one become [REDACTED].

A failed model call's reason ends up in an episode record and on stderr, and provider
errors echo keys, bearer tokens and `?key=` URLs; `redact` masks the values of
secret-looking environment variables (and any key a call used) and every credential shape.
"""

from __future__ import annotations

import os
import re

_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)$", re.IGNORECASE)
# Shapes of credentials; a group 1, when present, is a label kept in front of [REDACTED].
_SECRET_SHAPES = (
    re.compile(r"\b(?:sk|pk|rk|xai|gsk|hf)[-_][A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bAIza[0-9A-Za-z_\-]{20,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{8,}"),
    re.compile(r"(?i)([?&](?:key|api[-_]?key|token)=)[^&\s\"']+"),
    re.compile(r"(?i)((?:api[-_]?key|x-api-key|authorization)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]{8,}"),
)
REDACTED = "[REDACTED]"


def _mask(match: re.Match[str]) -> str:
    return (match.group(1) if match.re.groups else "") + REDACTED


def known_secrets(extra: tuple[str | None, ...] = ()) -> list[str]:
    """Values that must never be printed: keys named by env variables, and `extra`."""
    values = [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 6]
    values.extend(v for v in extra if v and len(v) >= 4)
    return sorted(set(values), key=len, reverse=True)


def redact(text: str, secrets: list[str] | None = None) -> str:
    """`text` with every known secret and anything shaped like a key replaced by [REDACTED]."""
    for secret in secrets if secrets is not None else known_secrets():
        text = text.replace(secret, REDACTED)
    for shape in _SECRET_SHAPES:
        text = shape.sub(_mask, text)
    return text
